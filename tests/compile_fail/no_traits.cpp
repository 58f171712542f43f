// expect: specialize posenc::encoder_traits<E>
// A type with no encoder_traits used as an encoder is a compile error that says what to do.
#include <posenc/encoding/traits.hpp>

struct not_an_encoder {};

int main() { return posenc::is_relative_v<not_an_encoder> ? 0 : 1; }
