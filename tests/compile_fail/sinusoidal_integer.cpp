// expect: posenc::sinusoidal: T must be float or double
// An absolute encoding of integers would silently truncate every value; the element type is checked at compile time.
#include <posenc/encoding/sinusoidal.hpp>

int main() {
  posenc::sinusoidal<int> enc(8);
  return static_cast<int>(enc.d_model());
}
