// SPDX-License-Identifier: MIT
// Test runner main for the MPI tests (Catch2 v2 or v3): MPI_Init, the tests, and one verdict for all ranks.
#include <mpi.h>

#if __has_include(<catch2/catch_session.hpp>)
#include <catch2/catch_session.hpp>
#else
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#endif

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int const failed = Catch::Session().run(argc, argv);
  // A failure on any rank fails the program on every rank (mpirun reports the first non-zero exit).
  int worst = 0;
  MPI_Allreduce(&failed, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return worst != 0 ? 1 : 0;
}
