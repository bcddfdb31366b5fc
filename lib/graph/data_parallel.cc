// Data parallelism over the ranks of the world, as a graph pass after autodiff. In SBP terms: inputs and
// everything computed from them are split on the batch, S(0); parameters are broadcast, B; so each rank's
// parameter gradient is a partial sum, P, and the optimizer needs B. The boxing P -> B is an all-reduce,
// done as one bucket per dtype and scaled by 1/ranks: the mean over ranks of per-rank mean losses is the
// mean over the global batch, so gradients, clipping norms and updates equal one process's.
#include <map>

#include "graph/builder.h"
#include "graph/passes.h"
#include "ops/registry.h"

namespace flowrun {

void data_parallel(Graph& g, int64_t ranks, const std::string& loss, bool shard_grads) {
  if (ranks <= 1) return;
  GraphBuilder b(g);
  const double mean = 1.0 / static_cast<double>(ranks);
  if (shard_grads) {
    // ZeRO-2: the boxing P -> S (a reduce-scatter) instead of P -> B: each rank receives only the flat shard
    // of every summed gradient whose optimizer state it keeps.
    for (auto& [p, grad] : g.param_grads()) {
      grad = b.op1("reduce_scatter_shard", {grad}, {{"shards", ranks}, {"scale", mean}},
                   cat("data_parallel/", g.value(p).name));
      g.mark_output("grad/" + g.value(p).name, grad);
    }
  }
  std::map<DType, std::vector<ValueId>> buckets;  // params by gradient dtype, in id order
  for (const auto& [p, grad] : g.param_grads())
    if (!shard_grads) buckets[g.value(grad).dtype()].push_back(p);
  for (const auto& [dtype, params] : buckets) {
    std::vector<ValueId> grads;
    for (ValueId p : params) grads.push_back(g.param_grads().at(p));
    const std::vector<ValueId> reduced =
        b.op("all_reduce", grads, {{"scale", mean}}, cat("data_parallel/grads_", dtype_name(dtype)));
    for (size_t i = 0; i < params.size(); ++i) {
      g.param_grads()[params[i]] = reduced[i];
      g.mark_output("grad/" + g.value(params[i]).name, reduced[i]);
    }
  }
  // The loss the trainer logs is the global batch's.
  if (auto it = g.outputs().find(loss); it != g.outputs().end())
    g.mark_output(loss, b.op("all_reduce", {it->second}, {{"scale", mean}}, "data_parallel/loss")[0]);
  // Random ops draw per element of the global batch (see KernelCtx::rng_offset).
  for (Node& n : g.nodes())
    if (!n.dead && OpRegistry::get().at(n.op).random) n.attrs.set("batch_split", true);
}

}  // namespace flowrun
