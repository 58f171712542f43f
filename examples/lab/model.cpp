// SPDX-License-Identifier: MIT
// The lab's model in its two precisions, compiled once for the lab and its tests (model.hpp).
#include "model.hpp"

template class lab::model<float>;
template class lab::model<double>;
