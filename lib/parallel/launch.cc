// Rank detection from the launcher's environment variables.
#include "parallel/launch.h"

#include <cstdlib>
#include <string_view>

#include "core/error.h"

namespace flowrun {

namespace {

// The integer value of `name`, or -1 when unset; an input_error when set to something else.
int int_var(const std::function<const char*(const char*)>& env, const char* name) {
  const char* v = env(name);
  if (!v) return -1;
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  if (*v == '\0' || *end != '\0' || x < 0 || x > 1'000'000)
    throw input_error(cat("environment variable ", name, "=\"", v, "\" is not a non-negative integer"));
  return static_cast<int>(x);
}

}  // namespace

LaunchInfo detect_launch(const std::function<const char*(const char*)>& env_in) {
  const std::function<const char*(const char*)> env =
      env_in ? env_in : [](const char* n) -> const char* { return std::getenv(n); };
  struct Scheme {
    const char *source, *rank, *world, *local;
  };
  const Scheme schemes[] = {
      {"OMPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"},
      {"PMIX", "PMIX_RANK", "SLURM_NTASKS", "SLURM_LOCALID"},
      {"SLURM", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"},
      {"RANK", "RANK", "WORLD_SIZE", "LOCAL_RANK"},
  };
  for (const Scheme& s : schemes) {
    const int rank = int_var(env, s.rank);
    if (rank < 0) continue;
    const int world = int_var(env, s.world);
    if (world < 1)
      throw input_error(cat(s.rank, " is set but ", s.world, " is not: cannot tell the world size"));
    if (rank >= world) throw input_error(cat(s.rank, "=", rank, " is not below ", s.world, "=", world));
    if (std::string_view(s.source) == "RANK" && world > 1)
      throw input_error(
          cat("RANK=", rank, " WORLD_SIZE=", world,
              " is a torchrun-style launch, which flowrun cannot join: its processes meet through "
              "MPI, so start them with `mpirun -np ",
              world, " flowrun ...` or `srun -n ", world, " --mpi=pmix flowrun ...`"));
    const int local = int_var(env, s.local);
    return {rank, world, local < 0 ? 0 : local, s.source};
  }
  return {};
}

}  // namespace flowrun
