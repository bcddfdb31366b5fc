// conv2d and its gradients through cuDNN 9's convolution API, and the adapters of the pooling kernels
// (ops/cuda/conv.cu). Each convolution shape gets its descriptors and algorithm once, kept for the process:
// cuDNN's heuristics (cudnnGet*Algorithm_v7), not timed trials, so that a shape runs the same algorithm on
// every run; the first result that is deterministic and whose workspace fits kConvWorkspace, the scratch
// every CUDA conv node declares for the planned arena (KernelDef::workspace: cuDNN cannot size it without a
// GPU, and programs are planned without one). f32 runs with CUDNN_FMA_MATH and direct algorithms (no TF32,
// no FFT or Winograd: the CPU's f32 arithmetic); f16 and bf16 accumulate in f32 and may use tensor cores. The
// bias is added by a kernel after the convolution (so f16/bf16 outputs are rounded twice).
#include "ops/cpu/conv.h"  // conv_geom, pool_geom: the geometry of the CPU kernels, one source

#include <cudnn.h>

#include <climits>
#include <map>
#include <mutex>
#include <tuple>

#include "ops/cuda/kernels.h"
#include "ops/cuda/launch.h"

namespace flowrun::cuda {

namespace {

constexpr size_t kConvWorkspace = size_t{64} << 20;

void check_dnn(cudnnStatus_t s, const char* what) {
  if (s != CUDNN_STATUS_SUCCESS)
    throw runtime_error(cat("cuDNN error in ", what, ": ", cudnnGetErrorString(s)));
}

cudnnDataType_t dnn_type(DType t) {
  switch (t) {
    case DType::f32:
      return CUDNN_DATA_FLOAT;
    case DType::f16:
      return CUDNN_DATA_HALF;
    case DType::bf16:
      return CUDNN_DATA_BFLOAT16;
    default:
      throw runtime_error(cat("cuDNN conv2d: no ", dtype_name(t), " kernel"));
  }
}

// This thread's handle (cuDNN handles are not shared between threads), made on first use and set to the
// kernel's stream. Never destroyed: a thread's or the process's end may come after the CUDA runtime's.
cudnnHandle_t handle_on(cudaStream_t s) {
  thread_local cudnnHandle_t h = nullptr;
  if (!h) check_dnn(cudnnCreate(&h), "cudnnCreate");
  check_dnn(cudnnSetStream(h, s), "cudnnSetStream");
  return h;
}

enum class Pass : int { forward, data, filter };

const char* pass_name(Pass p) {
  return p == Pass::forward ? "forward" : p == Pass::data ? "backward-data" : "backward-filter";
}

// One pass of one convolution: the key of the plan cache.
struct Problem {
  Pass pass;
  DType t;
  cpu::ConvGeom g;
  auto key() const {
    return std::tie(pass, t, g.n, g.c, g.h, g.w, g.o, g.kh, g.kw, g.sh, g.sw, g.ph, g.pw, g.dh, g.dw,
                    g.groups);
  }
  bool operator<(const Problem& o) const { return key() < o.key(); }
};

// A problem's descriptors and algorithm (a cudnnConvolution{Fwd,BwdData,BwdFilter}Algo_t of its pass).
struct Plan {
  cudnnTensorDescriptor_t x = nullptr, y = nullptr;
  cudnnFilterDescriptor_t w = nullptr;
  cudnnConvolutionDescriptor_t conv = nullptr;
  int algo = 0;
};

int dim(int64_t v) {
  FR_CHECK(v <= INT_MAX, "cuDNN takes int dimensions, not ", v);
  return static_cast<int>(v);
}

// The algorithms that convolve in a transformed domain (FFT, Winograd): their rounding is not a direct
// sum's, which f32 holds to the CPU's within ~1e-6.
bool transformed(cudnnConvolutionFwdAlgo_t a) {
  return a == CUDNN_CONVOLUTION_FWD_ALGO_FFT || a == CUDNN_CONVOLUTION_FWD_ALGO_FFT_TILING ||
         a == CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD || a == CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED;
}
bool transformed(cudnnConvolutionBwdDataAlgo_t a) {
  return a == CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT || a == CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT_TILING ||
         a == CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD ||
         a == CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD_NONFUSED;
}
bool transformed(cudnnConvolutionBwdFilterAlgo_t a) {
  return a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT || a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT_TILING ||
         a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD_NONFUSED;
}

// A heuristic result that may run: it works, gives the same bits every run, and fits the workspace; in f32,
// a direct sum without tensor cores.
template <typename Perf>
bool acceptable(const Perf& p, bool f32) {
  return p.status == CUDNN_STATUS_SUCCESS && p.determinism == CUDNN_DETERMINISTIC &&
         p.memory <= kConvWorkspace &&
         (!f32 ||
          ((p.mathType == CUDNN_DEFAULT_MATH || p.mathType == CUDNN_FMA_MATH) && !transformed(p.algo)));
}

// The heuristics' results are best first: the first acceptable one whose exact workspace, under the math
// type it will run with, fits. Leaves that math type on the descriptor.
template <typename Perf, typename Size>
bool pick(Plan& pl, const Perf* perf, int count, bool f32, Size workspace_size) {
  for (int i = 0; i < count; ++i) {
    if (!acceptable(perf[i], f32)) continue;
    check_dnn(cudnnSetConvolutionMathType(pl.conv, f32 ? CUDNN_FMA_MATH : perf[i].mathType),
              "cudnnSetConvolutionMathType");
    size_t bytes = 0;
    if (workspace_size(perf[i].algo, &bytes) != CUDNN_STATUS_SUCCESS || bytes > kConvWorkspace) continue;
    pl.algo = static_cast<int>(perf[i].algo);
    return true;
  }
  return false;
}

Plan make_plan(const Problem& p, cudnnHandle_t h) {
  const cpu::ConvGeom& g = p.g;
  const cudnnDataType_t t = dnn_type(p.t);
  const bool f32 = p.t == DType::f32;
  Plan pl;
  check_dnn(cudnnCreateTensorDescriptor(&pl.x), "cudnnCreateTensorDescriptor");
  check_dnn(cudnnSetTensor4dDescriptor(pl.x, CUDNN_TENSOR_NCHW, t, dim(g.n), dim(g.c), dim(g.h), dim(g.w)),
            "cudnnSetTensor4dDescriptor (x)");
  check_dnn(cudnnCreateTensorDescriptor(&pl.y), "cudnnCreateTensorDescriptor");
  check_dnn(cudnnSetTensor4dDescriptor(pl.y, CUDNN_TENSOR_NCHW, t, dim(g.n), dim(g.o), dim(g.oh), dim(g.ow)),
            "cudnnSetTensor4dDescriptor (y)");
  check_dnn(cudnnCreateFilterDescriptor(&pl.w), "cudnnCreateFilterDescriptor");
  check_dnn(
      cudnnSetFilter4dDescriptor(pl.w, t, CUDNN_TENSOR_NCHW, dim(g.o), dim(g.cg()), dim(g.kh), dim(g.kw)),
      "cudnnSetFilter4dDescriptor");
  check_dnn(cudnnCreateConvolutionDescriptor(&pl.conv), "cudnnCreateConvolutionDescriptor");
  // Cross-correlation (PyTorch's and the CPU's conv2d), accumulated in f32 for every storage type.
  check_dnn(cudnnSetConvolution2dDescriptor(pl.conv, dim(g.ph), dim(g.pw), dim(g.sh), dim(g.sw), dim(g.dh),
                                            dim(g.dw), CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT),
            "cudnnSetConvolution2dDescriptor");
  check_dnn(cudnnSetConvolutionGroupCount(pl.conv, dim(g.groups)), "cudnnSetConvolutionGroupCount");
  check_dnn(cudnnSetConvolutionMathType(pl.conv, f32 ? CUDNN_FMA_MATH : CUDNN_TENSOR_OP_MATH),
            "cudnnSetConvolutionMathType");
  int n = 0, c = 0, oh = 0, ow = 0;
  check_dnn(cudnnGetConvolution2dForwardOutputDim(pl.conv, pl.x, pl.w, &n, &c, &oh, &ow),
            "cudnnGetConvolution2dForwardOutputDim");
  FR_CHECK(n == g.n && c == g.o && oh == g.oh && ow == g.ow, "cuDNN's conv2d output ", n, "x", c, "x", oh,
           "x", ow, " is not the op's");
  bool found = false;
  switch (p.pass) {
    case Pass::forward: {
      cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
      int count = 0;
      check_dnn(cudnnGetConvolutionForwardAlgorithm_v7(h, pl.x, pl.w, pl.conv, pl.y,
                                                       CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &count, perf),
                "cudnnGetConvolutionForwardAlgorithm_v7");
      found = pick(pl, perf, count, f32, [&](cudnnConvolutionFwdAlgo_t a, size_t* bytes) {
        return cudnnGetConvolutionForwardWorkspaceSize(h, pl.x, pl.w, pl.conv, pl.y, a, bytes);
      });
      break;
    }
    case Pass::data: {
      cudnnConvolutionBwdDataAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
      int count = 0;
      check_dnn(cudnnGetConvolutionBackwardDataAlgorithm_v7(
                    h, pl.w, pl.y, pl.conv, pl.x, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &count, perf),
                "cudnnGetConvolutionBackwardDataAlgorithm_v7");
      found = pick(pl, perf, count, f32, [&](cudnnConvolutionBwdDataAlgo_t a, size_t* bytes) {
        return cudnnGetConvolutionBackwardDataWorkspaceSize(h, pl.w, pl.y, pl.conv, pl.x, a, bytes);
      });
      break;
    }
    case Pass::filter: {
      cudnnConvolutionBwdFilterAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
      int count = 0;
      check_dnn(cudnnGetConvolutionBackwardFilterAlgorithm_v7(
                    h, pl.x, pl.y, pl.conv, pl.w, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &count, perf),
                "cudnnGetConvolutionBackwardFilterAlgorithm_v7");
      found = pick(pl, perf, count, f32, [&](cudnnConvolutionBwdFilterAlgo_t a, size_t* bytes) {
        return cudnnGetConvolutionBackwardFilterWorkspaceSize(h, pl.x, pl.y, pl.conv, pl.w, a, bytes);
      });
      break;
    }
  }
  if (!found)
    throw runtime_error(cat("cuDNN has no deterministic ", pass_name(p.pass), " algorithm for a ",
                            dtype_name(p.t), " conv2d of x [", g.n, ", ", g.c, ", ", g.h, ", ", g.w, "], w [",
                            g.o, ", ", g.cg(), ", ", g.kh, ", ", g.kw, "] in ", kConvWorkspace >> 20,
                            " MiB of workspace"));
  return pl;
}

// The plan of a problem, made on first use; kept (map entries never move).
const Plan& plan_for(const Problem& p, cudnnHandle_t h) {
  static std::mutex mutex;
  static std::map<Problem, Plan> plans;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = plans.find(p);
  if (it == plans.end()) it = plans.emplace(p, make_plan(p, h)).first;
  return it->second;
}

void* workspace_of(const KernelCtx& c) {
  FR_CHECK(c.workspace_bytes >= kConvWorkspace, c.node->name,
           ": the workspace of a cuDNN conv2d was not planned");
  return c.workspace;
}

Pool pool_of(const Shape& x, const Attrs& a) {
  const cpu::PoolGeom g = cpu::pool_geom(x, a);
  return {g.n * g.c, g.h, g.w, g.oh, g.ow, g.kh, g.kw, g.sh, g.sw, g.ph, g.pw};
}

}  // namespace

size_t conv_workspace(const std::vector<TensorType>&, const std::vector<TensorType>&, const Attrs&) {
  return kConvWorkspace;
}

// An empty batch has nothing to convolve (cuDNN takes no empty tensors), and its weight gradient is zero.
void conv2d(const KernelCtx& c) {
  const TensorView &x = c.in[0], &w = c.in[1], &y = c.out[0];
  const cpu::ConvGeom g = cpu::conv_geom(*x.shape, *w.shape, c.attrs());
  if (g.n == 0) return;
  const cudaStream_t s = stream_of(c);
  const cudnnHandle_t h = handle_on(s);
  const Plan& p = plan_for({Pass::forward, x.dtype, g}, h);
  const float one = 1.0f, zero = 0.0f;
  check_dnn(cudnnConvolutionForward(h, &one, p.x, x.data, p.w, w.data, p.conv,
                                    static_cast<cudnnConvolutionFwdAlgo_t>(p.algo), workspace_of(c),
                                    c.workspace_bytes, &zero, p.y, y.data),
            "cudnnConvolutionForward");
  if (c.num_in > 2) channel_bias(storage_of(y.dtype), y.data, c.in[2].data, g.n, g.o, g.plane(), s);
}

void conv2d_grad_input(const KernelCtx& c) {
  const TensorView &dy = c.in[0], &w = c.in[1], &dx = c.out[0];
  const cpu::ConvGeom g = cpu::conv_geom(c.attrs().ints("in_shape"), *w.shape, c.attrs());
  if (g.n == 0) return;
  const cudnnHandle_t h = handle_on(stream_of(c));
  const Plan& p = plan_for({Pass::data, dy.dtype, g}, h);
  const float one = 1.0f, zero = 0.0f;
  check_dnn(cudnnConvolutionBackwardData(h, &one, p.w, w.data, p.y, dy.data, p.conv,
                                         static_cast<cudnnConvolutionBwdDataAlgo_t>(p.algo), workspace_of(c),
                                         c.workspace_bytes, &zero, p.x, dx.data),
            "cudnnConvolutionBackwardData");
}

void conv2d_grad_weight(const KernelCtx& c) {
  const TensorView &dy = c.in[0], &x = c.in[1], &dw = c.out[0];
  const cpu::ConvGeom g = cpu::conv_geom(*x.shape, c.attrs().ints("w_shape"), c.attrs());
  const cudaStream_t s = stream_of(c);
  if (g.n == 0) {
    check(cudaMemsetAsync(dw.data, 0, static_cast<size_t>(dw.numel()) * dtype_size(dw.dtype), s),
          "cudaMemsetAsync (conv2d weight gradient)");
    return;
  }
  const cudnnHandle_t h = handle_on(s);
  const Plan& p = plan_for({Pass::filter, dy.dtype, g}, h);
  const float one = 1.0f, zero = 0.0f;
  check_dnn(cudnnConvolutionBackwardFilter(h, &one, p.x, x.data, p.y, dy.data, p.conv,
                                           static_cast<cudnnConvolutionBwdFilterAlgo_t>(p.algo),
                                           workspace_of(c), c.workspace_bytes, &zero, p.w, dw.data),
            "cudnnConvolutionBackwardFilter");
}

void maxpool2d(const KernelCtx& c) {
  // As the gradient's mask below: attr relu comes from the CPU's backward fusion alone.
  FR_CHECK(!c.attrs().b("relu"), "maxpool2d with a fused relu has no CUDA kernel");
  const TensorView& x = c.in[0];
  maxpool2d(storage_of(x.dtype), pool_of(*x.shape, c.attrs()), x.data, c.out[0].data, c.out[1].as<int64_t>(),
            stream_of(c));
}

void maxpool2d_grad(const KernelCtx& c) {
  // The relu mask input comes from the CPU's backward fusion alone (graph/passes.cc).
  FR_CHECK(c.num_in == 2, "maxpool2d_grad with a relu mask has no CUDA kernel");
  maxpool2d_grad(storage_of(c.in[0].dtype), pool_of(c.attrs().ints("in_shape"), c.attrs()), c.in[0].data,
                 c.in[1].as<int64_t>(), c.out[0].data, stream_of(c));
}

void avgpool2d(const KernelCtx& c) {
  const TensorView& x = c.in[0];
  avgpool2d(storage_of(x.dtype), pool_of(*x.shape, c.attrs()), c.attrs().b("count_include_pad", true), x.data,
            c.out[0].data, stream_of(c));
}

void avgpool2d_grad(const KernelCtx& c) {
  avgpool2d_grad(storage_of(c.in[0].dtype), pool_of(c.attrs().ints("in_shape"), c.attrs()),
                 c.attrs().b("count_include_pad", true), c.in[0].data, c.out[0].data, stream_of(c));
}

void global_avgpool(const KernelCtx& c) {
  const TensorView& x = c.in[0];
  global_avgpool(storage_of(x.dtype), x.data, c.out[0].data, x.dim(0) * x.dim(1), x.dim(2) * x.dim(3),
                 stream_of(c));
}

}  // namespace flowrun::cuda
