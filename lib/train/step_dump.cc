// --dump-step: one optimizer step's batch, loss, parameters and gradients, written to HDF5.
#include "train/step_dump.h"

#include <cstring>

#include "ckpt/checkpoint.h"
#include "core/error.h"
#include "io/h5.h"

namespace flowrun {

namespace {

// The micro-batches' tensors one after the other along dim 0: the step's whole batch.
Tensor stack_rows(const std::vector<Tensor>& parts) {
  FR_CHECK(!parts.empty(), "no micro-batch was recorded");
  Shape shape = parts[0].shape();
  shape[0] = 0;
  for (const Tensor& t : parts) shape[0] += t.shape()[0];
  Tensor out = Tensor::empty(shape, parts[0].dtype());
  char* at = static_cast<char*>(out.raw());
  for (const Tensor& t : parts) {
    std::memcpy(at, t.raw(), t.nbytes());
    at += t.nbytes();
  }
  return out;
}

}  // namespace

StepRecorder::StepRecorder(Executor& ex, const std::vector<std::string>& params,
                           const std::vector<std::string>& state)
    : ex_(ex) {
  const Graph& g = ex.program().graph;
  for (const std::string& n : params) params_.emplace(n, ex.tensor(n).clone());
  for (const std::string& n : state)
    if (n.size() < 9 || n.compare(n.size() - 9, 9, "/grad_acc") != 0) state_.emplace(n, ex.tensor(n).clone());
  // Under accumulation the updates read the sum of the micro-batches' gradients from "opt/<p>/grad_acc";
  // otherwise they read the gradient autodiff produced, an arena value copied when its node has run.
  for (const auto& [p, grad] : g.param_grads()) {
    const std::string& name = g.value(p).name;
    const std::string acc = cat("opt/", name, "/grad_acc");
    if (ex.has_tensor(acc))
      acc_of_[name] = acc;
    else
      grad_of_[grad] = name;
  }
  // BERT's masking: the masked ids the model reads and the labels its loss reads. They may come from two
  // nodes of one name (the labels drawn again beside the loss, lib/nn/model.cc): the outputs read count.
  const std::vector<std::vector<NodeId>> readers = g.consumers();
  for (NodeId id : g.live_nodes_topological()) {
    const Node& n = g.node(id);
    if (n.op != "mlm_mask") continue;
    for (size_t k = 0; k < n.outputs.size() && k < 2; ++k)
      if (!readers[static_cast<size_t>(n.outputs[k])].empty())
        mlm_of_[n.outputs[k]] = cat(n.name, k == 0 ? "/ids" : "/labels");
  }
  const ValueId loss = g.outputs().count("loss") ? g.outputs().at("loss") : kNoValue;
  on_batch_ = [this](const Batch& b) {
    x_.push_back(b.x.clone());
    y_.push_back(b.y.clone());
  };
  on_node_ = [this, loss](const Node& n, double) {
    for (ValueId v : n.outputs) {
      if (v == loss) micro_loss_.push_back(static_cast<double>(ex_.value(v).data<float>()[0]));
      if (auto it = grad_of_.find(v); it != grad_of_.end()) grads_[it->second] = ex_.value(v);
      if (auto it = mlm_of_.find(v); it != mlm_of_.end()) mlm_[it->second].push_back(ex_.value(v));
    }
  };
}

void StepRecorder::write(const std::string& path, const std::string& config_yaml, int64_t step, double lr,
                         double loss, int64_t accumulation, uint64_t seed) {
  for (const auto& [name, acc] : acc_of_) {
    // The accumulator holds the sum over the micro-batches; the update scales it by 1 / accumulation.
    const Tensor& sum = ex_.tensor(acc);
    FR_CHECK(sum.dtype() == DType::f32, acc, " is not f32");
    Tensor mean = Tensor::empty(sum.shape(), DType::f32);
    for (int64_t i = 0; i < sum.numel(); ++i)
      mean.data<float>()[i] =
          static_cast<float>(static_cast<double>(sum.data<float>()[i]) / static_cast<double>(accumulation));
    grads_[name] = mean;
  }
  for (const auto& [name, t] : params_)
    if (!grads_.count(name))
      throw runtime_error(cat("--dump-step: the gradient of parameter '", name,
                              "' was not seen during the step (no node of the step produced it)"));
  replace_file_atomically(path, [&](const std::string& tmp) {
    h5::File f(tmp, h5::File::Mode::create);
    f.write("x", stack_rows(x_));
    f.write("y", stack_rows(y_));
    for (const auto& [name, t] : params_) f.write("params/" + name, t);
    for (const auto& [name, t] : grads_) f.write("grads/" + name, t);
    for (const auto& [name, t] : state_) f.write("state/" + name, t);
    for (const auto& [name, parts] : mlm_) f.write("mlm/" + name, stack_rows(parts));
    f.write("micro_loss", Tensor::from<double>({static_cast<int64_t>(micro_loss_.size())}, micro_loss_));
    f.set_attr("", "format", std::string("flowrun-step-dump"));
    f.set_attr("", "format_version", int64_t{1});
    f.set_attr("", "flowrun_version", std::string(FLOWRUN_VERSION));
    f.set_attr("", "step", step);
    f.set_attr("", "loss", loss);
    f.set_attr("", "lr", lr);
    f.set_attr("", "grad_accumulation", accumulation);
    f.set_attr("", "micro_batch_size", x_.front().shape()[0]);
    f.set_attr("", "seed", static_cast<int64_t>(seed));
    f.set_attr("", "config", config_yaml);
    f.close();
  });
}

}  // namespace flowrun
