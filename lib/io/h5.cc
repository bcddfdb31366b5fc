// The HDF5 layer: scoped hid_t guards, dtype <-> HDF5 type mapping, datasets, attributes and CRC-32C.
#include "io/h5.h"

#include <hdf5.h>
#include <sys/stat.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cstdlib>
#include <cstring>
#include <utility>

namespace flowrun::h5 {
namespace {

// Reading a user's file fails as bad input; writing fails as a machine problem (disk full, permissions).
enum class Op { read, write };

constexpr char kDTypeAttr[] = "flowrun_dtype";
constexpr hsize_t kChunkBytes = hsize_t{1} << 20;
constexpr unsigned kDeflateLevel = 4;

// The most specific message on HDF5's error stack ("file signature not found", "truncated file ..."),
// so our error says why, not only what; the stack is cleared afterwards. A failed system call's entry
// ("file write failed: time = ..., errno = 28, error message = 'No space left on device', buf = ...") is
// cut to its errno text.
std::string hdf5_error_detail() {
  std::string detail;
  auto first = [](unsigned, const H5E_error2_t* e, void* out) -> herr_t {
    auto* s = static_cast<std::string*>(out);
    if (s->empty() && e->desc) *s = e->desc;
    return 0;
  };
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, first, &detail);
  H5Eclear2(H5E_DEFAULT);
  const size_t errno_at = detail.find("errno = ");
  const size_t text_at = detail.find("error message = '");
  if (errno_at != std::string::npos && text_at != std::string::npos) {
    const size_t begin = text_at + 17, end = detail.find('\'', begin);
    const std::string call = detail.substr(0, detail.find(':'));
    detail = cat(call, ": ", detail.substr(begin, end == std::string::npos ? end : end - begin), " (errno ",
                 std::atoi(detail.c_str() + errno_at + 8), ")");
  }
  return detail;
}

[[noreturn]] void raise(Op op, const std::string& file, const std::string& what) {
  std::string msg = cat(file, ": ", what);
  const std::string detail = hdf5_error_detail();
  if (!detail.empty()) msg = cat(msg, " (HDF5: ", detail, ")");
  throw op == Op::read ? input_error(msg) : runtime_error(msg);
}

void check(herr_t status, Op op, const std::string& file, const std::string& what) {
  if (status < 0) raise(op, file, what);
}

// Owns one hid_t and closes it with the matching H5*close on every path out of a scope.
class Handle {
 public:
  using Closer = herr_t (*)(hid_t);
  Handle(hid_t id, Closer closer, Op op, const std::string& file, const std::string& what)
      : id_(id), closer_(closer) {
    if (id_ < 0) raise(op, file, what);
  }
  ~Handle() {
    if (id_ >= 0) closer_(id_);
  }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  hid_t get() const { return id_; }

 private:
  hid_t id_;
  Closer closer_;
};

std::string norm_obj(const std::string& obj) {
  return obj.empty() ? "/" : obj;
}

// Integer and float classes map to flowrun dtypes; narrower integers widen to i32 and unsigned 32-bit to
// i64 (HDF5 converts on read), so arrays written by other tools (h5py, int16 labels) load too.
DType dtype_of_h5(hid_t type, bool has_flowrun_attr, const std::string& flowrun_name, const std::string& file,
                  const std::string& path) {
  if (has_flowrun_attr) {
    const auto t = parse_dtype(flowrun_name);
    if (!t)
      throw input_error(cat(file, ": dataset ", path, ": unknown ", kDTypeAttr, " \"", flowrun_name, "\""));
    return *t;
  }
  const H5T_class_t cls = H5Tget_class(type);
  const size_t size = H5Tget_size(type);
  if (cls == H5T_FLOAT) return size <= 4 ? DType::f32 : DType::f64;
  if (cls == H5T_INTEGER) {
    const bool is_signed = H5Tget_sign(type) == H5T_SGN_2;
    if (size == 1 && !is_signed) return DType::u8;
    if (size < 4 || (size == 4 && is_signed)) return DType::i32;
    return DType::i64;
  }
  throw input_error(cat(file, ": dataset ", path, ": unsupported element type (class ", static_cast<int>(cls),
                        ", ", size, " bytes); flowrun reads integer and floating-point datasets"));
}

// The in-memory HDF5 type of a flowrun dtype; f16/bf16 travel as their 16-bit patterns.
hid_t mem_type(DType t) {
  switch (t) {
    case DType::f32:
      return H5T_NATIVE_FLOAT;
    case DType::f64:
      return H5T_NATIVE_DOUBLE;
    case DType::f16:
    case DType::bf16:
      return H5T_NATIVE_UINT16;
    case DType::i32:
      return H5T_NATIVE_INT32;
    case DType::i64:
      return H5T_NATIVE_INT64;
    case DType::u8:
      return H5T_NATIVE_UINT8;
  }
  return H5T_NATIVE_UINT8;
}

Handle make_space(const Shape& shape, Op op, const std::string& file, const std::string& what) {
  if (shape.empty()) return Handle(H5Screate(H5S_SCALAR), H5Sclose, op, file, what);
  std::vector<hsize_t> dims(shape.begin(), shape.end());
  return Handle(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr), H5Sclose, op, file,
                what);
}

Shape space_shape(hid_t space, const std::string& file, const std::string& what) {
  const int rank = H5Sget_simple_extent_ndims(space);
  if (rank < 0) raise(Op::read, file, what);
  std::vector<hsize_t> dims(static_cast<size_t>(rank));
  if (rank > 0 && H5Sget_simple_extent_dims(space, dims.data(), nullptr) < 0) raise(Op::read, file, what);
  return Shape(dims.begin(), dims.end());
}

Handle open_object(hid_t fid, const std::string& file, const std::string& obj, Op op) {
  return Handle(H5Oopen(fid, norm_obj(obj).c_str(), H5P_DEFAULT), H5Oclose, op, file,
                cat("cannot open object ", norm_obj(obj)));
}

// Attributes are replaced on a second write, so a key always holds the last value set.
void write_attr(hid_t fid, const std::string& file, const std::string& obj, const std::string& name,
                hid_t type, const Shape& shape, const void* data) {
  const std::string what = cat("cannot write attribute ", name, " on ", norm_obj(obj));
  const Handle target = open_object(fid, file, obj, Op::write);
  const htri_t exists = H5Aexists(target.get(), name.c_str());
  check(exists, Op::write, file, what);
  if (exists > 0) check(H5Adelete(target.get(), name.c_str()), Op::write, file, what);
  const Handle space = make_space(shape, Op::write, file, what);
  const Handle attr(H5Acreate2(target.get(), name.c_str(), type, space.get(), H5P_DEFAULT, H5P_DEFAULT),
                    H5Aclose, Op::write, file, what);
  if (numel(shape) > 0) check(H5Awrite(attr.get(), type, data), Op::write, file, what);
}

Handle open_attr(hid_t fid, const std::string& file, const std::string& obj, const std::string& name) {
  const Handle target = open_object(fid, file, obj, Op::read);
  return Handle(H5Aopen(target.get(), name.c_str(), H5P_DEFAULT), H5Aclose, Op::read, file,
                cat("no attribute ", name, " on ", norm_obj(obj)));
}

// The attribute's element count after checking its type class, for the typed readers below.
hssize_t attr_elements(hid_t attr, H5T_class_t want, const char* kind, const std::string& file,
                       const std::string& obj, const std::string& name) {
  const std::string what = cat("attribute ", name, " on ", norm_obj(obj));
  const Handle type(H5Aget_type(attr), H5Tclose, Op::read, file, what);
  const H5T_class_t cls = H5Tget_class(type.get());
  if (cls != want && !(want == H5T_FLOAT && cls == H5T_INTEGER))
    throw input_error(cat(file, ": ", what, " is not ", kind));
  const Handle space(H5Aget_space(attr), H5Sclose, Op::read, file, what);
  const hssize_t n = H5Sget_simple_extent_npoints(space.get());
  if (n < 0) raise(Op::read, file, what);
  return n;
}

template <typename T>
T read_scalar_attr(hid_t fid, const std::string& file, const std::string& obj, const std::string& name,
                   H5T_class_t want, const char* kind, hid_t mtype) {
  const Handle attr = open_attr(fid, file, obj, name);
  if (attr_elements(attr.get(), want, kind, file, obj, name) != 1)
    throw input_error(cat(file, ": attribute ", name, " on ", norm_obj(obj), " is not a single value"));
  T v{};
  check(H5Aread(attr.get(), mtype, &v), Op::read, file,
        cat("cannot read attribute ", name, " on ", norm_obj(obj)));
  return v;
}

// Fixed-length strings may be NUL-padded; variable-length ones (h5py's default) are read and freed by HDF5.
std::string read_string_attr(hid_t attr, hid_t type, const std::string& file, const std::string& what) {
  if (H5Tis_variable_str(type) > 0) {
    const Handle mtype(H5Tcopy(H5T_C_S1), H5Tclose, Op::read, file, what);
    check(H5Tset_size(mtype.get(), H5T_VARIABLE), Op::read, file, what);
    char* s = nullptr;
    check(H5Aread(attr, mtype.get(), &s), Op::read, file, what);
    std::string out = s ? s : "";
    H5free_memory(s);
    return out;
  }
  const size_t size = H5Tget_size(type);
  std::string out(size, '\0');
  check(H5Aread(attr, type, out.data()), Op::read, file, what);
  out.resize(std::strlen(out.c_str()));
  return out;
}

struct VisitState {
  std::string prefix;
  std::vector<std::string> names;
};

herr_t collect_dataset(hid_t, const char* name, const H5O_info_t* info, void* data) {
  auto* st = static_cast<VisitState*>(data);
  if (info->type == H5O_TYPE_DATASET) st->names.push_back(st->prefix + name);
  return 0;
}

// CRC-32C tables for slicing-by-8: table[k][b] is the CRC of byte b followed by k zero bytes.
constexpr uint32_t kCastagnoli = 0x82F63B78u;
constexpr std::array<std::array<uint32_t, 256>, 8> make_crc_tables() {
  std::array<std::array<uint32_t, 256>, 8> t{};
  for (uint32_t b = 0; b < 256; ++b) {
    uint32_t c = b;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ kCastagnoli : c >> 1;
    t[0][b] = c;
  }
  for (uint32_t b = 0; b < 256; ++b)
    for (size_t k = 1; k < 8; ++k) t[k][b] = (t[k - 1][b] >> 8) ^ t[0][t[k - 1][b] & 0xff];
  return t;
}
constexpr auto kCrcTables = make_crc_tables();
// Slicing-by-8 loads little-endian words (x86-64, AArch64).
static_assert(std::endian::native == std::endian::little);

}  // namespace

void quiet_hdf5_errors() {
  // HDF5 1.10 closes the files still open at exit, and crashes (SIGSEGV in H5F__close_cb) on one whose close
  // already failed, as a write to a full disk leaves it: every file here is closed by its owner, so the exit
  // hook has nothing to do. It must come before HDF5's first call, which this is.
  static const bool no_atexit = [] { return H5dont_atexit() >= 0; }();
  (void)no_atexit;
  // Per thread: a thread-safe HDF5 keeps one error stack, and one printing switch, for each thread (the
  // async checkpoint writer's included).
  thread_local bool quiet = false;
  if (!quiet) H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  quiet = true;
}

File::File(const std::string& path, Mode mode) : path_(path) {
  quiet_hdf5_errors();
  if (mode == Mode::read) {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) throw input_error(cat(path, ": no such file"));
    const hid_t id = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
    if (id < 0) raise(Op::read, path, "not a readable HDF5 file");
    id_ = id;
    return;
  }
  // The 1.8 object format at least: attributes above 64 KiB (a long resolved config) go to dense storage.
  const Handle fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose, Op::write, path, "cannot create file access list");
  check(H5Pset_libver_bounds(fapl.get(), H5F_LIBVER_V18, H5F_LIBVER_LATEST), Op::write, path,
        "cannot set format bounds");
  const hid_t id = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.get());
  if (id < 0) raise(Op::write, path, "cannot create HDF5 file");
  id_ = id;
}

File::~File() {
  if (id_ >= 0) H5Fclose(id_);
}

File::File(File&& o) noexcept : path_(std::move(o.path_)), id_(std::exchange(o.id_, -1)) {}

void File::write(const std::string& path, const Tensor& t) {
  FR_CHECK(t.device().kind == DeviceKind::cpu, "h5 write of a ", device_str(t.device()), " tensor");
  const std::string what = cat("cannot write dataset ", path);
  if (exists(path)) check(H5Ldelete(id_, path.c_str(), H5P_DEFAULT), Op::write, path_, what);
  const Handle lcpl(H5Pcreate(H5P_LINK_CREATE), H5Pclose, Op::write, path_, what);
  check(H5Pset_create_intermediate_group(lcpl.get(), 1), Op::write, path_, what);
  const Handle space = make_space(t.shape(), Op::write, path_, what);
  const hid_t type = mem_type(t.dtype());
  const Handle ds(H5Dcreate2(id_, path.c_str(), type, space.get(), lcpl.get(), H5P_DEFAULT, H5P_DEFAULT),
                  H5Dclose, Op::write, path_, what);
  if (t.numel() > 0)
    check(H5Dwrite(ds.get(), type, H5S_ALL, H5S_ALL, H5P_DEFAULT, t.raw()), Op::write, path_, what);
  if (t.dtype() == DType::f16 || t.dtype() == DType::bf16)
    set_attr(path, kDTypeAttr, std::string(dtype_name(t.dtype())));
}

void File::write_bytes(const std::string& path, const uint8_t* data, size_t n, bool compress) {
  const std::string what = cat("cannot write dataset ", path);
  if (exists(path)) check(H5Ldelete(id_, path.c_str(), H5P_DEFAULT), Op::write, path_, what);
  const Handle lcpl(H5Pcreate(H5P_LINK_CREATE), H5Pclose, Op::write, path_, what);
  check(H5Pset_create_intermediate_group(lcpl.get(), 1), Op::write, path_, what);
  const Handle dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose, Op::write, path_, what);
  // A chunk may not exceed a fixed dimension, so an empty array stays contiguous.
  if (compress && n > 0) {
    const hsize_t chunk = std::min<hsize_t>(n, kChunkBytes);
    check(H5Pset_chunk(dcpl.get(), 1, &chunk), Op::write, path_, what);
    check(H5Pset_deflate(dcpl.get(), kDeflateLevel), Op::write, path_, what);
  }
  const hsize_t dims = n;
  const Handle space(H5Screate_simple(1, &dims, nullptr), H5Sclose, Op::write, path_, what);
  const Handle ds(
      H5Dcreate2(id_, path.c_str(), H5T_NATIVE_UINT8, space.get(), lcpl.get(), dcpl.get(), H5P_DEFAULT),
      H5Dclose, Op::write, path_, what);
  if (n > 0)
    check(H5Dwrite(ds.get(), H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, data), Op::write, path_, what);
}

Tensor File::read(const std::string& path) const {
  const std::string what = cat("cannot read dataset ", path);
  const Handle ds(H5Dopen2(id_, path.c_str(), H5P_DEFAULT), H5Dclose, Op::read, path_,
                  cat("no dataset ", path));
  const Handle space(H5Dget_space(ds.get()), H5Sclose, Op::read, path_, what);
  Tensor t = Tensor::empty(space_shape(space.get(), path_, what), dtype(path));
  if (t.numel() > 0)
    check(H5Dread(ds.get(), mem_type(t.dtype()), H5S_ALL, H5S_ALL, H5P_DEFAULT, t.raw()), Op::read, path_,
          what);
  return t;
}

Tensor File::read_rows(const std::string& path, int64_t begin, int64_t count) const {
  const std::string what = cat("cannot read rows of dataset ", path);
  const Handle ds(H5Dopen2(id_, path.c_str(), H5P_DEFAULT), H5Dclose, Op::read, path_,
                  cat("no dataset ", path));
  const Handle space(H5Dget_space(ds.get()), H5Sclose, Op::read, path_, what);
  Shape shape = space_shape(space.get(), path_, what);
  if (shape.empty()) throw input_error(cat(path_, ": dataset ", path, " is a scalar, it has no rows"));
  if (begin < 0 || count < 0 || begin + count > shape[0])
    throw input_error(cat(path_, ": dataset ", path, ": rows [", begin, ", ", begin + count,
                          ") are outside its ", shape[0], " rows"));
  shape[0] = count;
  Tensor t = Tensor::empty(shape, dtype(path));
  if (t.numel() == 0) return t;
  std::vector<hsize_t> start(shape.size(), 0), counts(shape.begin(), shape.end());
  start[0] = static_cast<hsize_t>(begin);
  check(H5Sselect_hyperslab(space.get(), H5S_SELECT_SET, start.data(), nullptr, counts.data(), nullptr),
        Op::read, path_, what);
  const Handle mspace = make_space(shape, Op::read, path_, what);
  check(H5Dread(ds.get(), mem_type(t.dtype()), mspace.get(), space.get(), H5P_DEFAULT, t.raw()), Op::read,
        path_, what);
  return t;
}

// Each prefix must exist before H5Lexists may be asked about the next one (it fails on a missing group).
bool File::exists(const std::string& path) const {
  if (path.empty() || path == "/") return true;
  size_t pos = 0;
  while (pos != std::string::npos) {
    pos = path.find('/', pos + 1);
    const std::string prefix = path.substr(0, pos);
    const htri_t e = H5Lexists(id_, prefix.c_str(), H5P_DEFAULT);
    if (e < 0) raise(Op::read, path_, cat("cannot look up ", prefix));
    if (e == 0) return false;
  }
  return true;
}

Shape File::shape(const std::string& path) const {
  const Handle ds(H5Dopen2(id_, path.c_str(), H5P_DEFAULT), H5Dclose, Op::read, path_,
                  cat("no dataset ", path));
  const Handle space(H5Dget_space(ds.get()), H5Sclose, Op::read, path_, cat("cannot read dataset ", path));
  return space_shape(space.get(), path_, cat("cannot read dataset ", path));
}

DType File::dtype(const std::string& path) const {
  const Handle ds(H5Dopen2(id_, path.c_str(), H5P_DEFAULT), H5Dclose, Op::read, path_,
                  cat("no dataset ", path));
  const Handle type(H5Dget_type(ds.get()), H5Tclose, Op::read, path_,
                    cat("cannot read type of dataset ", path));
  const bool tagged = has_attr(path, kDTypeAttr);
  return dtype_of_h5(type.get(), tagged, tagged ? attr_string(path, kDTypeAttr) : "", path_, path);
}

std::vector<std::string> File::datasets(const std::string& group) const {
  const std::string g = norm_obj(group);
  const Handle obj = open_object(id_, path_, g, Op::read);
  VisitState st;
  if (g != "/") st.prefix = cat(g.substr(g.front() == '/' ? 1 : 0), g.back() == '/' ? "" : "/");
  check(H5Ovisit(obj.get(), H5_INDEX_NAME, H5_ITER_INC, collect_dataset, &st), Op::read, path_,
        cat("cannot list datasets below ", g));
  std::sort(st.names.begin(), st.names.end());
  st.names.erase(std::unique(st.names.begin(), st.names.end()), st.names.end());
  return st.names;
}

void File::set_attr(const std::string& obj, const std::string& name, const std::string& value) {
  const std::string what = cat("cannot write attribute ", name, " on ", norm_obj(obj));
  // HDF5 strings cannot be zero bytes long: an empty value is stored as one NUL of padding.
  const Handle type(H5Tcopy(H5T_C_S1), H5Tclose, Op::write, path_, what);
  check(H5Tset_size(type.get(), std::max<size_t>(value.size(), 1)), Op::write, path_, what);
  check(H5Tset_strpad(type.get(), H5T_STR_NULLPAD), Op::write, path_, what);
  check(H5Tset_cset(type.get(), H5T_CSET_UTF8), Op::write, path_, what);  // YAML text may hold any Unicode
  const std::string padded = value.empty() ? std::string(1, '\0') : value;
  write_attr(id_, path_, obj, name, type.get(), {}, padded.data());
}

void File::set_attr(const std::string& obj, const std::string& name, int64_t value) {
  write_attr(id_, path_, obj, name, H5T_NATIVE_INT64, {}, &value);
}

void File::set_attr(const std::string& obj, const std::string& name, double value) {
  write_attr(id_, path_, obj, name, H5T_NATIVE_DOUBLE, {}, &value);
}

void File::set_attr(const std::string& obj, const std::string& name, const std::vector<int64_t>& value) {
  write_attr(id_, path_, obj, name, H5T_NATIVE_INT64, {static_cast<int64_t>(value.size())}, value.data());
}

bool File::has_attr(const std::string& obj, const std::string& name) const {
  const Handle target = open_object(id_, path_, obj, Op::read);
  const htri_t e = H5Aexists(target.get(), name.c_str());
  if (e < 0) raise(Op::read, path_, cat("cannot look up attribute ", name, " on ", norm_obj(obj)));
  return e > 0;
}

std::vector<std::string> File::attrs(const std::string& obj) const {
  const Handle target = open_object(id_, path_, obj, Op::read);
  std::vector<std::string> names;
  auto collect = [](hid_t, const char* name, const H5A_info_t*, void* data) -> herr_t {
    static_cast<std::vector<std::string>*>(data)->push_back(name);
    return 0;
  };
  check(H5Aiterate2(target.get(), H5_INDEX_NAME, H5_ITER_INC, nullptr, collect, &names), Op::read, path_,
        cat("cannot list attributes of ", norm_obj(obj)));
  std::sort(names.begin(), names.end());
  return names;
}

std::string File::attr_string(const std::string& obj, const std::string& name) const {
  const Handle attr = open_attr(id_, path_, obj, name);
  if (attr_elements(attr.get(), H5T_STRING, "a string", path_, obj, name) != 1)
    throw input_error(cat(path_, ": attribute ", name, " on ", norm_obj(obj), " is not a single string"));
  const std::string what = cat("cannot read attribute ", name, " on ", norm_obj(obj));
  const Handle type(H5Aget_type(attr.get()), H5Tclose, Op::read, path_, what);
  return read_string_attr(attr.get(), type.get(), path_, what);
}

int64_t File::attr_int(const std::string& obj, const std::string& name) const {
  return read_scalar_attr<int64_t>(id_, path_, obj, name, H5T_INTEGER, "an integer", H5T_NATIVE_INT64);
}

double File::attr_double(const std::string& obj, const std::string& name) const {
  return read_scalar_attr<double>(id_, path_, obj, name, H5T_FLOAT, "a number", H5T_NATIVE_DOUBLE);
}

std::vector<int64_t> File::attr_ints(const std::string& obj, const std::string& name) const {
  const Handle attr = open_attr(id_, path_, obj, name);
  const hssize_t n = attr_elements(attr.get(), H5T_INTEGER, "an integer list", path_, obj, name);
  std::vector<int64_t> v(static_cast<size_t>(n));
  if (n > 0)
    check(H5Aread(attr.get(), H5T_NATIVE_INT64, v.data()), Op::read, path_,
          cat("cannot read attribute ", name, " on ", norm_obj(obj)));
  return v;
}

void File::flush() {
  if (id_ >= 0) check(H5Fflush(id_, H5F_SCOPE_GLOBAL), Op::write, path_, "cannot flush");
}

// Closing writes the remaining metadata, so its failure (disk full) must be reported, once.
void File::close() {
  if (id_ < 0) return;
  const herr_t st = H5Fclose(std::exchange(id_, -1));
  check(st, Op::write, path_, "cannot close (write the file's metadata)");
}

uint32_t crc32c(const void* data, size_t n, uint32_t seed) {
  const auto* p = static_cast<const uint8_t*>(data);
  uint32_t c = ~seed;
  for (; n >= 8; n -= 8, p += 8) {
    uint32_t lo;
    uint32_t hi;
    std::memcpy(&lo, p, 4);
    std::memcpy(&hi, p + 4, 4);
    lo ^= c;  // little-endian words: the low byte is the first byte of the stream
    c = kCrcTables[7][lo & 0xff] ^ kCrcTables[6][(lo >> 8) & 0xff] ^ kCrcTables[5][(lo >> 16) & 0xff] ^
        kCrcTables[4][lo >> 24] ^ kCrcTables[3][hi & 0xff] ^ kCrcTables[2][(hi >> 8) & 0xff] ^
        kCrcTables[1][(hi >> 16) & 0xff] ^ kCrcTables[0][hi >> 24];
  }
  for (; n > 0; --n, ++p) c = (c >> 8) ^ kCrcTables[0][(c ^ *p) & 0xff];
  return ~c;
}

}  // namespace flowrun::h5
