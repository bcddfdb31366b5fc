// Where this process sits in a launched job: rank, world size and local rank, read from the launcher's
// environment. The launchers are mpirun and srun: the processes join through MPI, which a torchrun-style
// environment (RANK, WORLD_SIZE, MASTER_ADDR without an MPI launcher) cannot give them.
#pragma once

#include <functional>
#include <string>

namespace flowrun {

struct LaunchInfo {
  int rank = 0, world = 1, local_rank = 0;
  std::string source = "none";  // which variables told: OMPI, PMIX, SLURM, RANK, or none (one process)
};

// Tries, in order: OMPI_COMM_WORLD_{RANK,SIZE,LOCAL_RANK} (mpirun; inside sbatch every rank still sees
// SLURM_PROCID=0, so OpenMPI's own variables come first), PMIX_RANK with SLURM_NTASKS (srun --mpi=pmix sets
// only these), SLURM_{PROCID,NTASKS,LOCALID}, then RANK/WORLD_SIZE/LOCAL_RANK, which only a one-process world
// may use: a larger one is an input_error that names mpirun and srun. Malformed or inconsistent values are an
// input_error naming the variable. `env` stands for std::getenv (tests pass their own).
LaunchInfo detect_launch(const std::function<const char*(const char*)>& env = nullptr);

}  // namespace flowrun
