// Every op family registers itself through one function listed here; register_all_ops calls them all.
#pragma once

namespace flowrun {

class OpRegistry;

void register_elementwise_ops(OpRegistry& r);  // ops/elementwise.cc
void register_shape_ops(OpRegistry& r);        // ops/shape.cc
void register_reduce_ops(OpRegistry& r);       // ops/reduce.cc
void register_matmul_ops(OpRegistry& r);       // ops/matmul.cc
void register_nn_ops(OpRegistry& r);           // ops/nn.cc: softmax, losses, dropout, embedding
void register_norm_ops(OpRegistry& r);         // ops/norm.cc: layernorm, rmsnorm, batchnorm
void register_conv_ops(OpRegistry& r);         // ops/conv.cc: conv2d and pooling
void register_attention_ops(OpRegistry& r);    // ops/attention.cc
void register_optim_ops(OpRegistry& r);        // ops/optim.cc
void register_comm_ops(OpRegistry& r);         // ops/comm.cc: collectives inserted by the parallel passes
// ops/cuda/register.cc, in libflowrun_cuda.so: the CUDA kernels of the ops above, added when the backend is
// opened (core/cuda_backend.h).
void register_cuda_kernels(OpRegistry& r);

inline void register_all_ops(OpRegistry& r) {
  register_elementwise_ops(r);
  register_shape_ops(r);
  register_reduce_ops(r);
  register_matmul_ops(r);
  register_nn_ops(r);
  register_norm_ops(r);
  register_conv_ops(r);
  register_attention_ops(r);
  register_optim_ops(r);
  register_comm_ops(r);
}

}  // namespace flowrun
