// Argument checks and readers (arguments.h).
#include "arguments.h"

#include <ATen/EmptyTensor.h>

#include <cmath>

namespace specdec {

void check_cpu_tensor(const at::Tensor& t, const char* name) {
  // A meta tensor has no data and a CUDA one would be read as a host pointer.
  TORCH_CHECK_VALUE(t.defined(), "specdec: ", name, " is an undefined tensor");
  TORCH_CHECK_VALUE(t.device().is_cpu(), "specdec: ", name, " must be a CPU tensor for the C++ kernel, got one on ", t.device());
  TORCH_CHECK_VALUE(t.layout() == at::kStrided, "specdec: ", name, " must be a dense (strided) tensor, got layout ", t.layout());
}

void check_row_vector(const at::Tensor& t, const char* name, int64_t batch) {
  check_cpu_tensor(t, name);
  TORCH_CHECK_VALUE(t.dim() == 0 || (t.dim() == 1 && t.size(0) == batch), "specdec: ", name, " must be a scalar or a (", batch, ",) tensor, got ", t.sizes());
}

void check_keys(const std::optional<at::Tensor>& t, const char* name, int64_t batch) {
  if (!t.has_value() || !t->defined()) return;
  check_cpu_tensor(*t, name);
  TORCH_CHECK_VALUE(t->scalar_type() == at::kLong, "specdec: ", name, " must be an int64 tensor, got ", t->scalar_type());
  TORCH_CHECK_VALUE(t->dim() == 1 && t->size(0) == batch, "specdec: ", name, " must have shape (", batch, ",), got ", t->sizes());
}

int32_t dtype_code(at::ScalarType t, const char* name) {
  switch (t) {
    case at::kFloat: return kF32;
    case at::kBFloat16: return kBF16;
    case at::kHalf: return kF16;
    default: TORCH_CHECK_VALUE(false, "specdec: ", name, " must be float32, bfloat16 or float16, got ", t);
  }
}

at::Tensor new_cpu_tensor(at::IntArrayRef sizes, at::ScalarType dtype) { return at::Tensor(at::detail::empty_cpu(sizes, dtype)); }

namespace {

// The logits as read: (B, L, V) with a vocabulary stride of 1 (a (B, V) tensor as (B, 1, V)).
// The caller's tensor is read in place, not copied: a tensor copy of a Python tensor takes a
// reference to its Python object, and dropping it without the GIL (the kernels run without it)
// would have to take the GIL back.
Logits read_logits(const at::Tensor& t, int32_t dtype) {
  Logits l;
  if (t.stride(-1) != 1) l.owned = t.contiguous();
  const at::Tensor& read = l.owned.defined() ? l.owned : t;
  l.dtype = dtype;
  const bool flat = read.dim() == 2;
  l.batch = read.size(0);
  l.lines = flat ? 1 : read.size(1);
  l.vocab = read.size(-1);
  l.base = static_cast<const char*>(read.const_data_ptr());
  l.stride_b = read.stride(0) * dtype_size(dtype);
  l.stride_i = flat ? 0 : read.stride(1) * dtype_size(dtype);
  return l;
}

}  // namespace

Logits checked_target(const at::Tensor& t, const char* shape, bool allow_2d) {
  check_cpu_tensor(t, "target_logits");
  TORCH_CHECK_VALUE(t.dim() == 3 || (allow_2d && t.dim() == 2), "specdec: target_logits must be ", shape, ", got ", t.sizes());
  TORCH_CHECK_VALUE((t.dim() == 2 || t.size(1) >= 1) && t.size(-1) >= 1, "specdec: target_logits needs a line and a vocabulary entry");
  TORCH_CHECK_VALUE(t.size(-1) <= (int64_t{1} << 32), "specdec: vocabularies above 2^32 entries are not supported");
  return read_logits(t, dtype_code(t.scalar_type(), "target_logits"));
}

std::optional<Logits> checked_draft(const std::optional<at::Tensor>& t, int64_t batch, int64_t lines, int64_t vocab, const char* shape) {
  if (!t.has_value() || !t->defined()) return std::nullopt;
  const at::Tensor& d = *t;
  check_cpu_tensor(d, "draft_logits");
  TORCH_CHECK_VALUE(d.dim() == 3 && d.size(0) == batch && d.size(1) == lines && d.size(2) >= 1 && d.size(2) <= vocab, "specdec: draft_logits must be ",
                    shape, " with 1 <= Vd <= V, got ", d.sizes());
  return read_logits(d, dtype_code(d.scalar_type(), "draft_logits"));
}

CallLogits::CallLogits(const at::Tensor& target_logits, const std::optional<at::Tensor>& draft_logits, int64_t draft_extra, const char* target_shape,
                       const char* draft_shape, bool allow_2d)
    : target(checked_target(target_logits, target_shape, allow_2d)),
      batch(target.batch),
      lines(target.lines),
      draft(checked_draft(draft_logits, batch, lines + draft_extra, target.vocab, draft_shape)),
      draft_lines(lines + draft_extra),
      draft_vocab(draft ? draft->vocab : target.vocab) {}

float row_float(const at::Tensor& t, int64_t b) {
  const char* base = static_cast<const char*>(t.const_data_ptr());
  const int64_t off = t.dim() == 0 ? 0 : b * t.stride(0);
  switch (t.scalar_type()) {
    case at::kFloat: return reinterpret_cast<const float*>(base)[off];
    case at::kDouble: return static_cast<float>(reinterpret_cast<const double*>(base)[off]);
    case at::kHalf: return static_cast<float>(reinterpret_cast<const at::Half*>(base)[off]);
    case at::kBFloat16: return static_cast<float>(reinterpret_cast<const at::BFloat16*>(base)[off]);
    default: TORCH_CHECK_VALUE(false, "specdec: expected a floating-point parameter tensor, got ", t.scalar_type());
  }
}

int64_t row_int(const at::Tensor& t, int64_t b) {
  const char* base = static_cast<const char*>(t.const_data_ptr());
  const int64_t off = t.dim() == 0 ? 0 : b * t.stride(0);
  switch (t.scalar_type()) {
    case at::kLong: return reinterpret_cast<const int64_t*>(base)[off];
    case at::kInt: return reinterpret_cast<const int32_t*>(base)[off];
    case at::kShort: return reinterpret_cast<const int16_t*>(base)[off];
    case at::kByte: return reinterpret_cast<const uint8_t*>(base)[off];
    default: TORCH_CHECK_VALUE(false, "specdec: expected an integer parameter tensor, got ", t.scalar_type());
  }
}

IdReader::IdReader(const at::Tensor& ids, const char* name) {
  check_cpu_tensor(ids, name);
  TORCH_CHECK_VALUE(ids.dim() == 2, "specdec: ", name, " must be 2-D, got ", ids.sizes());
  TORCH_CHECK_VALUE(ids.scalar_type() == at::kLong || ids.scalar_type() == at::kInt, "specdec: ", name, " must be int32 or int64");
  base_ = static_cast<const char*>(ids.const_data_ptr());
  is_long_ = ids.scalar_type() == at::kLong;
  stride0_ = ids.stride(0);
  stride1_ = ids.stride(1);
}

void check_row_tensors(const RowTensors& t, int64_t batch) {
  check_row_vector(t.temperature, "temperature", batch);
  check_row_vector(t.top_k, "top_k", batch);
  check_row_vector(t.top_p, "top_p", batch);
  check_keys(t.seeds, "seeds", batch);
  check_keys(t.offsets, "offsets", batch);
}

RowInputs read_row(const RowTensors& t, int64_t b) {
  RowInputs r;
  const float temperature = row_float(t.temperature, b);
  const int64_t top_k = row_int(t.top_k, b);
  const float top_p = row_float(t.top_p, b);
  r.bad = !(temperature >= 0.0f) || std::isinf(temperature) || top_k < 0 || !(top_p > 0.0f && top_p <= 1.0f);
  r.params.greedy = temperature == 0.0f;
  const bool plain = r.params.greedy || r.bad;
  r.params.inv_t = plain ? 1.0f : 1.0f / temperature;
  r.params.top_k = plain ? 0 : top_k;
  r.params.top_p = plain ? 1.0f : top_p;
  const bool has_seeds = t.seeds.has_value() && t.seeds->defined();
  const bool has_offsets = t.offsets.has_value() && t.offsets->defined();
  const int64_t key = has_seeds ? row_int(*t.seeds, b) : static_cast<int64_t>(static_cast<uint64_t>(t.base_key) + static_cast<uint64_t>(b));
  const int64_t offset = has_offsets ? row_int(*t.offsets, b) : 0;
  r.bad = r.bad || (has_seeds && key < 0) || offset < 0;
  r.key0 = static_cast<uint32_t>(static_cast<uint64_t>(key) & 0xFFFFFFFFu);
  r.key1 = static_cast<uint32_t>((static_cast<uint64_t>(key) >> 32) & 0xFFFFFFFFu);
  r.offset = static_cast<uint64_t>(offset);
  return r;
}

}  // namespace specdec
