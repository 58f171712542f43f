// expect: posenc: this target has no vector instruction set posenc supports.*(compilation terminated|2 errors generated)
// x86-64 flags: -mno-sse2
// A target without the vector instructions the kernels need (here x86-64 with SSE2 turned off;
// elsewhere 32-bit ARM or AArch64 with +nosimd) stops at the first posenc header with one
// sentence naming the instruction sets and the options, not a cascade of template errors: the
// compile ends there (g++: "compilation terminated"; clang: its error count, 2).
#include <posenc/posenc.hpp>

int main() { return 0; }
