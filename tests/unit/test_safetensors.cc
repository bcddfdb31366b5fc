// Tests of the safetensors reader and writer: round trips of every flowrun dtype, the byte layout the format
// fixes, and each kind of damaged file rejected with the file, tensor and position named.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "ckpt/weights.h"
#include "io/safetensors.h"

namespace flowrun::testing {
namespace {

namespace fs = std::filesystem;

std::string temp_path(const std::string& name) {
  static const std::string dir = [] {
    const std::string d = cat(::testing::TempDir(), "flowrun-test-safetensors-", getpid());
    fs::create_directories(d);
    return d;
  }();
  return cat(dir, "/", name);
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void spit(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good());
}

// A file of the header `json` (length prefix added) followed by `data`.
std::string file_of(const std::string& json, const std::string& data) {
  std::string out(8, '\0');
  const uint64_t n = json.size();
  for (int i = 0; i < 8; ++i) out[static_cast<size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + json + data;
}

// The message of the input_error that reading `bytes` raises ("" when it reads).
std::string read_error(const std::string& bytes) {
  const std::string path = temp_path("bad.safetensors");
  spit(path, bytes);
  try {
    safetensors::read(path);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::bad_input) << e.what();
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos)
        << "the message names the file: " << e.what();
    return e.what();
  }
  return "";
}

TEST(Safetensors, RoundTripsEveryDtypeAndMetadata) {
  std::map<std::string, Tensor> in;
  in["a/w"] = Tensor::from<float>({2, 3}, {1, -2, 3.5f, 4, 5, 6});
  in["b"] = Tensor::from<double>({1}, {0.125});
  in["c"] = Tensor::from<int64_t>({3}, {1, -1, int64_t{1} << 40});
  in["d"] = Tensor::from<int32_t>({2, 1}, {7, -7});
  in["e"] = Tensor::from<uint8_t>({4}, {0, 1, 254, 255});
  in["f"] = Tensor::from<float>({3}, {1.5f, -0.25f, 3}).to(DType::f16);
  in["g"] = Tensor::from<float>({2}, {1.5f, -0.25f}).to(DType::bf16);
  in["empty"] = Tensor::empty({0, 4}, DType::f32);
  in["scalar"] = Tensor::from<float>({}, {42});
  const std::string path = temp_path("round.safetensors");
  safetensors::write(path, in, {{"format", "pt"}, {"note", "x"}});
  std::map<std::string, std::string> meta;
  const auto out = safetensors::read(path, &meta);
  EXPECT_EQ(meta, (std::map<std::string, std::string>{{"format", "pt"}, {"note", "x"}}));
  ASSERT_EQ(out.size(), in.size());
  for (const auto& [name, t] : in) {
    const Tensor& u = out.at(name);
    EXPECT_EQ(u.shape(), t.shape()) << name;
    EXPECT_EQ(u.dtype(), t.dtype()) << name;
    EXPECT_EQ(std::memcmp(u.raw(), t.raw(), t.nbytes()), 0) << name;
  }
  // The data starts 8-byte aligned (header padded with spaces), and a second write is the same bytes.
  const safetensors::Header h = safetensors::read_header(path);
  EXPECT_EQ(h.data_start % 8, 0u);
  const std::string again = temp_path("again.safetensors");
  safetensors::write(again, out, meta);
  EXPECT_EQ(slurp(path), slurp(again));
}

TEST(Safetensors, ByteLayoutIsTheFormats) {
  const std::string path = temp_path("layout.safetensors");
  safetensors::write(path, {{"x", Tensor::from<float>({2}, {1, 2})}});
  const std::string bytes = slurp(path);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[static_cast<size_t>(i)]);
  ASSERT_EQ(bytes.size(), 8 + n + 8);
  const std::string json = bytes.substr(8, n);
  EXPECT_EQ(json.substr(0, json.find_last_not_of(' ') + 1),
            R"({"x":{"data_offsets":[0,8],"dtype":"F32","shape":[2]}})");
  float v[2];
  std::memcpy(v, bytes.data() + 8 + n, 8);
  EXPECT_EQ(v[0], 1.0f);
  EXPECT_EQ(v[1], 2.0f);
}

TEST(Safetensors, DamagedFilesNameTheProblem) {
  const std::string ok_header = R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  const std::string data(8, '\0');
  EXPECT_EQ(read_error(file_of(ok_header, data)), "");
  EXPECT_NE(read_error("abc").find("shorter than the 8-byte header length"), std::string::npos);
  // A header length past the end (a truncated file, or not a safetensors file).
  EXPECT_NE(read_error(file_of(ok_header, data).substr(0, 30)).find("runs past the end of the file"),
            std::string::npos);
  // Truncated data: the offsets run past the data.
  EXPECT_NE(
      read_error(file_of(ok_header, data.substr(0, 5))).find("tensor 'w': data_offsets [0, 8] run past"),
      std::string::npos);
  // Bad JSON: the byte of the file is named (the second comma: 8 + 20).
  const std::string bad_json = file_of(R"({"w":{"dtype":"F32",,}})", "");
  EXPECT_NE(read_error(bad_json).find("is not valid JSON at byte 28"), std::string::npos)
      << read_error(bad_json);
  EXPECT_NE(read_error(file_of("[1]", "")).find("not an object"), std::string::npos);
  EXPECT_NE(read_error(file_of(R"({"w":{"dtype":"F33","shape":[2],"data_offsets":[0,8]}})", data))
                .find("tensor 'w': unknown dtype 'F33'"),
            std::string::npos);
  EXPECT_NE(read_error(file_of(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", data))
                .find("tensor 'w': F32 [3] needs 12 bytes but data_offsets [0, 8] hold 8"),
            std::string::npos);
  EXPECT_NE(read_error(file_of(R"({"w":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", data))
                .find("not a non-negative integer"),
            std::string::npos);
  EXPECT_NE(read_error(file_of(R"({"w":{"dtype":"F32","shape":[2]}})", data)).find("data_offsets must be"),
            std::string::npos);
  EXPECT_NE(read_error(file_of(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", data))
                .find("end before they begin"),
            std::string::npos);
  EXPECT_NE(read_error(file_of(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":1}})", data))
                .find("unknown key 'x'"),
            std::string::npos);
  // Overlapping tensors, a gap, data left over, a duplicated name.
  const std::string two = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                          R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})";
  EXPECT_NE(read_error(file_of(two, std::string(12, '\0')))
                .find("tensor 'b' (data_offsets [4, 12]) overlaps tensor 'a'"),
            std::string::npos);
  const std::string gap = R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                          R"("b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})";
  EXPECT_NE(read_error(file_of(gap, std::string(12, '\0'))).find("data bytes [4, 8) before tensor 'b'"),
            std::string::npos);
  EXPECT_NE(read_error(file_of(ok_header, std::string(12, '\0'))).find("the tensors end at data byte 8"),
            std::string::npos);
  const std::string dup = R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                          R"("a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})";
  EXPECT_NE(read_error(file_of(dup, data)).find("tensor 'a' appears twice"), std::string::npos);
  EXPECT_NE(read_error(file_of(R"({"__metadata__":{"k":1}})", "")).find("__metadata__ 'k' is number"),
            std::string::npos);
  // A dtype of the format flowrun does not compute in.
  EXPECT_NE(read_error(file_of(R"({"w":{"dtype":"I16","shape":[4],"data_offsets":[0,8]}})", data))
                .find("tensor 'w' is I16, which flowrun does not read"),
            std::string::npos);
  // A length over the format's 100 MB limit.
  std::string huge(8, '\0');
  huge[7] = 0x7f;
  EXPECT_NE(read_error(huge + "{}").find("exceeds the format's limit"), std::string::npos);
}

TEST(Safetensors, WriteFailuresAreReported) {
  EXPECT_THROW(safetensors::write("/nonexistent-dir/x.safetensors", {{"x", Tensor::from<float>({1}, {1})}}),
               Error);
  if (fs::exists("/dev/full")) {
    try {
      safetensors::write("/dev/full", {{"x", Tensor::from<float>({1}, {1})}});
      ADD_FAILURE() << "writing to /dev/full succeeded";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("cannot write /dev/full"), std::string::npos) << e.what();
    }
  }
}

// A map as models/hf/*.yaml gives one: a transposed weight, a block pattern, a tied and an optional tensor.
HfMap small_map() {
  HfMap m;
  m.file = "test-map.yaml";
  m.base_prefix = "model.";
  m.tensors = {{"emb/w", "model.emb.weight", false},
               {"blocks.{i}/fc/w", "model.h.{i}.fc.weight", true},
               {"head/b", "head.bias", false}};
  m.tied = {{"lm_head.weight", "emb/w"}};
  m.optional = {"head/b"};
  m.ignore = {"model.h.{i}.buffer"};
  return m;
}

std::map<std::string, WantedTensor> small_model() {
  return {{"emb/w", {{4, 2}, DType::f32}},
          {"blocks.0/fc/w", {{3, 2}, DType::f32}},
          {"blocks.1/fc/w", {{3, 2}, DType::f32}},
          {"head/b", {{3}, DType::f32}}};
}

std::string import_error(const std::map<std::string, Tensor>& file,
                         const std::map<std::string, WantedTensor>& want) {
  const std::string path = temp_path("import_bad.safetensors");
  safetensors::write(path, file);
  try {
    import_safetensors(path, want, small_map());
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::bad_input);
    return e.what();
  }
  return "";
}

TEST(SafetensorsImport, MapsTransposesConvertsAndSkips) {
  const Tensor emb = Tensor::from<float>({4, 2}, {1, 2, 3, 4, 5, 6, 7, 8});
  // Hugging Face layout (in, out) = (2, 3) for the transposed weight; F64 and BF16 convert to f32.
  const Tensor fc0 = Tensor::from<double>({2, 3}, {1, 2, 3, 4, 5, 6});
  const Tensor fc1 = Tensor::from<float>({2, 3}, {0.5f, 1, 1.5f, 2, 2.5f, 3}).to(DType::bf16);
  // A base-model file: no "model." prefix; the tied copy equals its tensor; a buffer and an unused tensor.
  const std::string path = temp_path("import.safetensors");
  safetensors::write(path, {{"emb.weight", emb},
                            {"h.0.fc.weight", fc0},
                            {"h.1.fc.weight", fc1},
                            {"h.0.buffer", Tensor::from<float>({1}, {0})},
                            {"pooler.weight", Tensor::from<float>({1}, {0})}});
  const auto got = import_safetensors(path, small_model(), small_map());
  ASSERT_EQ(got.size(), 3u);  // head/b is optional: absent, kept at its initial value
  EXPECT_EQ(got.at("emb/w").to_f64(), emb.to_f64());
  EXPECT_EQ(got.at("blocks.0/fc/w").shape(), (Shape{3, 2}));
  EXPECT_EQ(got.at("blocks.0/fc/w").dtype(), DType::f32);
  EXPECT_EQ(got.at("blocks.0/fc/w").to_f64(), (std::vector<double>{1, 4, 2, 5, 3, 6}));
  EXPECT_EQ(got.at("blocks.1/fc/w").to_f64(), (std::vector<double>{0.5, 2, 1, 2.5, 1.5, 3}));
  // flowrun's own names are recognised without metadata (and such a file is complete: no optional tensors).
  const std::string own = temp_path("own.safetensors");
  safetensors::write(own, {{"emb/w", emb},
                           {"blocks.0/fc/w", Tensor::from<float>({3, 2}, {1, 2, 3, 4, 5, 6})},
                           {"blocks.1/fc/w", Tensor::from<float>({3, 2}, {1, 2, 3, 4, 5, 6})},
                           {"head/b", Tensor::from<float>({3}, {1, 2, 3})}});
  const auto mine = import_safetensors(own, small_model(), small_map());
  EXPECT_EQ(mine.at("blocks.1/fc/w").to_f64(), (std::vector<double>{1, 2, 3, 4, 5, 6}));
}

TEST(SafetensorsImport, EveryMisfitIsListed) {
  const Tensor emb = Tensor::from<float>({4, 2}, {1, 2, 3, 4, 5, 6, 7, 8});
  // A wrong shape, a missing block, an integer tensor for a float parameter: all three in one message.
  const std::string msg =
      import_error({{"model.emb.weight", Tensor::from<float>({4, 3}, std::vector<float>(12, 0))},
                    {"model.h.0.fc.weight", Tensor::from<int64_t>({2, 3}, {1, 2, 3, 4, 5, 6})}},
                   small_model());
  EXPECT_NE(msg.find("3 tensors do not fit the model"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'model.emb.weight' (-> 'emb/w') is F32 [4,3] but the model's is [4,2]"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("'model.h.0.fc.weight' (-> 'blocks.0/fc/w', transposed) is I64 but the model's is f32"),
            std::string::npos)
      << msg;
  EXPECT_NE(
      msg.find("'blocks.1/fc/w' [3,2] of the model is missing (its Hugging Face name: model.h.1.fc.weight)"),
      std::string::npos)
      << msg;
  // Names neither flowrun's nor the map's, without a map: said so.
  const std::string path = temp_path("foreign.safetensors");
  safetensors::write(path, {{"something.else", emb}});
  try {
    import_safetensors(path, small_model(), std::nullopt);
    ADD_FAILURE() << "a file of foreign names imported";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("are not the model's parameter names"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace flowrun::testing
