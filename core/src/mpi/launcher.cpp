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

}  // namespace tessera
