// Opening and checking token files (see tokens.h).
#include "data/tokens.h"

#include <cstring>

namespace flowrun {

namespace {

// Little-endian int32 at p (the file's byte order, whatever the machine's).
int64_t le_i32(const uint8_t* p) {
  const uint32_t u = static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 |
                     static_cast<uint32_t>(p[2]) << 16 | static_cast<uint32_t>(p[3]) << 24;
  return static_cast<int32_t>(u);
}

// The vocabulary check reads this much at a time: few calls, yet a small part of any address space.
constexpr int64_t kScanChunk = 16 << 20;

}  // namespace

TokenSpan open_byte_file(const std::string& path, bool unmapped) {
  TokenSpan s;
  s.file = std::make_shared<const MappedFile>(path, unmapped);
  s.count = s.file->size();
  s.where = path;
  return s;
}

TokenFile open_token_file(const std::string& path, const std::string& format, bool unmapped) {
  FR_CHECK(format == "auto" || format == "uint16" || format == "llmc", "token format ", format);
  TokenFile t;
  t.tokens.file = std::make_shared<const MappedFile>(path, unmapped);
  t.tokens.width = 2;
  t.tokens.where = path;
  const MappedFile& f = *t.tokens.file;
  int64_t magic = 0;
  if (f.size() >= 4) f.with_range(0, 4, [&](const uint8_t* p) { magic = le_i32(p); });
  t.llmc = format == "llmc" || (format == "auto" && f.size() >= 4 && magic == kLlmcMagic);
  if (t.llmc) {
    if (f.size() < kLlmcHeaderBytes)
      throw input_error(cat(path, ": ", f.size(), " bytes, shorter than llm.c's ", kLlmcHeaderBytes,
                            "-byte header (data.token_format llmc)"));
    int64_t header[3] = {0, 0, 0};
    f.with_range(0, 12, [&](const uint8_t* p) {
      for (int i = 0; i < 3; ++i) header[i] = le_i32(p + 4 * i);
    });
    if (header[0] != kLlmcMagic)
      throw input_error(cat(path, ": byte offset 0: magic ", header[0], " is not llm.c's ", kLlmcMagic,
                            " (data.token_format llmc; use uint16 for a flat token file)"));
    if (header[1] != 1)
      throw input_error(cat(path, ": byte offset 4: llm.c header version ", header[1],
                            header[1] == 2 ? " (uint32 tokens)" : "",
                            " is not supported: only version 1 (uint16 tokens)"));
    const int64_t body = f.size() - kLlmcHeaderBytes;
    if (header[2] < 0 || body != header[2] * 2)
      throw input_error(cat(path, ": byte offset 8: the header's token count ", header[2], " needs ",
                            kLlmcHeaderBytes, " + ", header[2], " x 2 bytes, the file has ", f.size(),
                            " (truncated, or not an llm.c file)"));
    t.tokens.offset = kLlmcHeaderBytes;
    t.tokens.count = header[2];
  } else {
    if (f.size() % 2 != 0)
      throw input_error(cat(path, ": ", f.size(),
                            " bytes, an odd count: not whole uint16 tokens (byte offset ", f.size() - 1,
                            " starts half a token; data.token_format ", format, ")"));
    t.tokens.count = f.size() / 2;
  }
  return t;
}

void check_tokens_below(const TokenSpan& s, int64_t vocab, const std::string& key) {
  FR_CHECK(s.file, s.where, ": only mapped token files are checked");
  const int64_t step = kScanChunk / s.width;
  for (int64_t first = 0; first < s.count; first += step) {
    const int64_t n = std::min(step, s.count - first);
    s.with_tokens(first, n, [&](const uint8_t* p) {
      for (int64_t t = 0; t < n; ++t) {
        const int64_t v = s.at(p, t);
        if (v >= vocab)
          throw input_error(cat(s.where, ": token ", first + t, " (byte offset ",
                                s.offset + (first + t) * s.width, ") is ", v,
                                ", not below the vocabulary size ", vocab, " (", key, ")"));
      }
    });
  }
}

std::pair<TokenSpan, TokenSpan> cut_tokens(const TokenSpan& s, int64_t at) {
  FR_CHECK(at >= 0 && at <= s.count, s.where, ": cut at ", at, " of ", s.count);
  TokenSpan head = s, tail = s;
  head.count = at;
  tail.offset = s.offset + at * s.width;
  tail.count = s.count - at;
  return {head, tail};
}

}  // namespace flowrun
