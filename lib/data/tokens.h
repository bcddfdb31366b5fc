// Token streams for the language-model datasets: a byte stream (KJV's HDF5, any file read as bytes) or a
// token file as nanoGPT (flat little-endian uint16, its train.bin) and llm.c (a 256-int32 header, then uint16
// tokens) write them. Samples are windows of seq_len + 1 tokens at a stride of seq_len.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "core/tensor.h"
#include "data/mapped.h"

namespace flowrun {

// `count` tokens of `width` bytes (1: bytes; 2: little-endian uint16) from byte `offset` of a mapped file,
// or of `bytes` (u8, in memory) when there is no file. Copies share the mapping.
struct TokenSpan {
  std::shared_ptr<const MappedFile> file;
  Tensor bytes;
  int64_t offset = 0;
  int64_t count = 0;
  int width = 1;
  std::string where;  // for messages: "PATH" or "PATH: /train", with the part of the file it is

  // Calls f(p) with tokens [first, first + n) starting at p (raw, `width` bytes each).
  template <typename F>
  void with_tokens(int64_t first, int64_t n, F&& f) const {
    FR_CHECK(first >= 0 && n >= 0 && first + n <= count, where, ": tokens [", first, ", ", first + n, ") of ",
             count);
    if (file) {
      file->with_range(offset + first * width, n * width, f);
    } else {
      f(bytes.data<uint8_t>() + offset + first * width);
    }
  }
  // Token t of raw bytes p (from with_tokens).
  int64_t at(const uint8_t* p, int64_t t) const {
    return width == 1 ? p[t] : static_cast<int64_t>(p[2 * t]) | static_cast<int64_t>(p[2 * t + 1]) << 8;
  }
};

// The magic number and header size of llm.c's token files (dev/data/data_common.py: int32 header[256] =
// {20240520, version, token count, 0...}; version 1 = GPT-2 tokens as uint16).
constexpr int32_t kLlmcMagic = 20240520;
constexpr int64_t kLlmcHeaderBytes = 256 * 4;
// GPT-2's vocabulary, which llm.c's version 1 means: the default data.vocab_size of an llm.c file.
constexpr int64_t kGpt2Vocab = 50257;

// Any file as a byte stream (vocabulary 256).
TokenSpan open_byte_file(const std::string& path, bool unmapped = false);

struct TokenFile {
  TokenSpan tokens;
  bool llmc = false;  // it has llm.c's header
};
// A token file in `format` (data.token_format): "uint16" (flat), "llmc" (the header required) or "auto"
// (llm.c when the file starts with its magic, else flat). A wrong header (magic, version, a token count
// that does not match the file's size) or an odd byte count is an input_error naming the file and offset.
TokenFile open_token_file(const std::string& path, const std::string& format, bool unmapped = false);

// One streaming pass: every token of `s` below `vocab`, else an input_error naming the file, the token's
// index and byte offset and `key` (the setting that gave `vocab`).
void check_tokens_below(const TokenSpan& s, int64_t vocab, const std::string& key);

// The stream cut at token `at`: [0, at) and [at, count).
std::pair<TokenSpan, TokenSpan> cut_tokens(const TokenSpan& s, int64_t at);

}  // namespace flowrun
