// Data parallelism over the ranks of the data axis, as a graph pass after autodiff. In SBP terms: inputs and
// everything computed from them are split on the batch, S(0); parameters are broadcast, B; so each rank's
// parameter gradient is a partial sum, P, and the optimizer needs B. The boxing P -> B is an all-reduce, in
// buckets started while the backward pass goes on, scaled by 1/ranks: the mean over ranks of per-rank mean
// losses is the mean over the global batch, so gradients, clipping norms and updates equal one process's.
// Under ZeRO-2 it is P -> S instead: a reduce-scatter of each gradient.
#include <algorithm>
#include <map>

#include "graph/builder.h"
#include "graph/passes.h"
#include "ops/registry.h"

namespace flowrun {

void data_parallel(Graph& g, int64_t ranks, const std::string& loss, bool shard_grads, int64_t bucket_bytes) {
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
  } else {
    // Buckets of about bucket_bytes, filled in the order the backward pass produces the gradients (the last
    // layer's first): each bucket's all-reduce starts as soon as its last gradient exists (all_reduce_start
    // is eager) and is waited for only before the optimizer, so it overlaps the rest of the backward pass.
    const std::vector<NodeId> order = g.live_nodes_topological();
    std::vector<size_t> position(g.nodes().size(), 0);
    for (size_t i = 0; i < order.size(); ++i) position[static_cast<size_t>(order[i])] = i;
    std::vector<ValueId> params;
    for (const auto& [p, grad] : g.param_grads()) params.push_back(p);
    auto made = [&](ValueId p) { return position[static_cast<size_t>(g.value(g.param_grads().at(p)).producer)]; };
    std::stable_sort(params.begin(), params.end(), [&](ValueId a, ValueId b) { return made(a) < made(b); });
    std::map<DType, std::vector<ValueId>> open;  // a bucket being filled per gradient dtype
    std::map<DType, size_t> open_bytes;
    int bucket = 0;
    auto close = [&](DType t) {
      std::vector<ValueId>& ps = open[t];
      if (ps.empty()) return;
      std::vector<ValueId> grads;
      std::vector<int64_t> ranks, dims;
      for (ValueId p : ps) {
        const ValueId grad = g.param_grads().at(p);
        grads.push_back(grad);
        ranks.push_back(static_cast<int64_t>(g.value(grad).shape().size()));
        dims.insert(dims.end(), g.value(grad).shape().begin(), g.value(grad).shape().end());
      }
      const std::string name = cat("data_parallel/bucket", bucket++, "_", dtype_name(t));
      const std::vector<ValueId> started = b.op("all_reduce_start", grads, {}, name + "/start");
      const std::vector<ValueId> reduced =
          b.op("all_reduce_wait", started, {{"ranks", ranks}, {"dims", dims}, {"scale", mean}}, name + "/wait");
      for (size_t i = 0; i < ps.size(); ++i) {
        g.param_grads()[ps[i]] = reduced[i];
        g.mark_output("grad/" + g.value(ps[i]).name, reduced[i]);
      }
      ps.clear();
      open_bytes[t] = 0;
    };
    for (ValueId p : params) {
      const Value& grad = g.value(g.param_grads().at(p));
      open[grad.dtype()].push_back(p);
      open_bytes[grad.dtype()] += grad.nbytes();
      if (open_bytes[grad.dtype()] >= static_cast<size_t>(bucket_bytes)) close(grad.dtype());
    }
    for (auto& [t, ps] : open) close(t);
  }
  // The loss the trainer logs is the global batch's.
  if (auto it = g.outputs().find(loss); it != g.outputs().end())
    g.mark_output(loss, b.op("all_reduce", {it->second}, {{"scale", mean}}, "data_parallel/loss")[0]);
  // Random ops draw per element of the global batch (see KernelCtx::rng_offset).
  for (Node& n : g.nodes())
    if (!n.dead && OpRegistry::get().at(n.op).random) n.attrs.set("batch_split", true);
}

}  // namespace flowrun
