// Autoregressive generation from a trained decoder (`flowrun generate`): a key/value cache, so that each new
// token costs one position rather than the whole prefix, and one static program per input shape (the
// prompt's prefill, the single-token decode step, a slide of the context window), compiled on first use and
// cached by shape, all sharing the parameters and the caches.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "config/config.h"
#include "core/tensor.h"
#include "nn/model.h"
#include "runtime/executor.h"

namespace flowrun {

// A decoder of cfg's model over `batch` sequences with a context of `context` positions (the training
// data.seq_len): one program per step length, made on first use.
class Decoder {
 public:
  // `weights(program, model)`: every parameter of the model, whole (a checkpoint's, or a safetensors file's
  // through import_weights), given the first program and the model it was built from; loaded once into
  // that program and shared by the others. An input_error when a parameter is missing or of another shape.
  using Weights = std::function<std::map<std::string, Tensor>(const Program&, const BuiltModel&)>;
  Decoder(const RunConfig& cfg, int64_t vocab, int64_t batch, int64_t context, const Weights& weights,
          const std::string& source);
  ~Decoder();
  Decoder(const Decoder&) = delete;
  Decoder& operator=(const Decoder&) = delete;

  // Runs `len` new tokens per sequence (tokens: batch x len, row-major) at positions position ..
  // position + len - 1, extending the caches (which must hold the positions before it). Returns the logits
  // (batch, len, vocab) f32, valid until the next step.
  Tensor step(const std::vector<int64_t>& tokens, int64_t len, int64_t position);

  int64_t context() const { return context_; }
  int64_t batch() const { return batch_; }
  // The step lengths compiled so far, in the order they were first needed.
  const std::vector<int64_t>& compiled() const { return compiled_; }
  double compile_seconds() const { return compile_seconds_; }

 private:
  struct Compiled {
    std::unique_ptr<Executor> ex;
    double flops = 0;  // of one step
  };
  // The program of steps of `len` tokens, compiled on first use (`built`, when given, receives its model).
  Compiled& program(int64_t len, BuiltModel* built = nullptr);
  RunConfig cfg_;
  int64_t vocab_, batch_, context_;
  std::map<int64_t, Compiled> by_len_;  // the program cache, by the step's length
  std::vector<int64_t> compiled_;
  double compile_seconds_ = 0;
};

struct GenerateOptions {
  std::string checkpoint;  // a checkpoint file, a sharded checkpoint or a run directory (its newest)
  // The prompt: text for a byte-level model (vocabulary 256), else token ids written as integers separated
  // by white space (the tokenizer is the user's).
  std::string prompt;
  int64_t max_new_tokens = 256;
  double temperature = 1.0;  // 0 = greedy (the most likely token)
  int64_t top_k = 0;         // 0 = every token
  double top_p = 1.0;        // nucleus: the smallest set of tokens holding this much probability
  uint64_t seed = 1;
  int64_t num_samples = 1;
};

struct GenerateResult {
  std::vector<std::vector<int64_t>> tokens;  // per sample: the new tokens
  int64_t prompt_len = 0;                    // tokens of the prompt prefilled (after cutting to the context)
  double prefill_seconds = 0;                // the prompt's prefill
  double decode_seconds = 0;                 // single-token steps
  int64_t decode_steps = 0;
  int64_t slides = 0;        // times the context window slid (the last 3/4 prefilled again)
  double slide_seconds = 0;  // those prefills
  std::vector<int64_t> compiled;
  double compile_seconds = 0;  // compiling the programs (not in the prefill and decode times)
  bool bytes = false;          // a byte-level model: the tokens are text
};

// Samples from the model of cfg with the parameters of opts.checkpoint. `emit(sample, text)` sees each new
// token as soon as it is drawn (streaming), as the text to print: the byte itself for a byte-level model,
// else " <id>". Input errors (missing checkpoint, a model that is not a decoder, a prompt outside the
// vocabulary) are input_errors.
GenerateResult generate(const RunConfig& cfg, const GenerateOptions& opts,
                        const std::function<void(int64_t sample, const std::string& text)>& emit);

// How `generate` prints token `t`: the byte itself for a byte-level model (`bytes`), else " <id>".
std::string token_text(int64_t t, bool bytes);

// The prompt's tokens: its bytes for a byte-level model (vocab 256), else integers separated by white space,
// each below vocab (an input_error naming the word and its place otherwise).
std::vector<int64_t> prompt_tokens(const std::string& prompt, int64_t vocab);

// The next token from one row of logits: greedy at temperature 0, else softmax(logits / temperature) cut to
// the top_k most likely and to the top_p nucleus, drawn with the uniform `u` in [0, 1). Ties go to the lower
// token id, so the result is a pure function of its arguments.
int64_t sample_token(const float* logits, int64_t vocab, double temperature, int64_t top_k, double top_p,
                     double u);

}  // namespace flowrun
