// Whether a launcher started this process: the variables Open MPI's mpirun, MPICH's Hydra, PMIx
// and Slurm's srun (with an MPI plugin) set for each rank.
#include <cstdlib>

#include "tessera/comm.h"

namespace tessera {

bool started_by_mpi_launcher() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE", "PMI_RANK", "MPI_LOCALNRANKS"})
    if (std::getenv(v) != nullptr) return true;
  return false;
}

int launcher_rank() {
  for (const char* v : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"})
    if (const char* r = std::getenv(v)) return std::atoi(r);
  return 0;
}

}  // namespace tessera
