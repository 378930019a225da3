// Argument checks and readers shared by the drivers (chain.cpp, block.cpp, tree.cpp): every tensor
// a kernel reads is checked to be a dense CPU tensor of the right shape, and per-row parameters of
// any dtype and layout (a 0-d tensor expanded to (B,) has stride 0) are read in place.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <optional>

#include "lines.h"

namespace specdec {

void check_cpu_tensor(const at::Tensor& t, const char* name);
// A scalar or a (batch,) tensor.
void check_row_vector(const at::Tensor& t, const char* name, int64_t batch);
// An optional (batch,) int64 tensor (seeds, offsets).
void check_keys(const std::optional<at::Tensor>& t, const char* name, int64_t batch);
// float32 / bfloat16 / float16 logits: their kernel.h DType.
int32_t dtype_code(at::ScalarType t, const char* name);

// A new dense CPU tensor, allocated without a trip through the dispatcher (what at::empty ends in
// for CPU tensors; for a tiny call the dispatcher costs more than the kernel's work).
at::Tensor new_cpu_tensor(at::IntArrayRef sizes, at::ScalarType dtype);

// A call's logits, checked: (B, L, V) target logits (`shape` names the layout in messages), read in
// place (only a vocabulary stride other than 1 forces a copy), and an optional draft of (batch,
// lines, Vd), 1 <= Vd <= vocab. A (B, V) tensor is read as (B, 1, V) (sample's logits). The
// caller's tensors must outlive the Logits.
struct Logits {
  at::Tensor owned;  // the contiguous copy read when the vocabulary stride is not 1 (else undefined: the call's tensor is read)
  int32_t dtype = kF32;
  int64_t vocab = 0;
  int64_t batch = 0, lines = 0;
  const char* base = nullptr;
  int64_t stride_b = 0, stride_i = 0;  // in bytes
  const char* line(int64_t b, int64_t i) const { return base + b * stride_b + i * stride_i; }  // the first value of line (b, i)
};
Logits checked_target(const at::Tensor& t, const char* shape, bool allow_2d = false);
std::optional<Logits> checked_draft(const std::optional<at::Tensor>& t, int64_t batch, int64_t lines, int64_t vocab, const char* shape);

// Both logits of a call: (batch, lines, V) target logits and optional (batch, lines + draft_extra,
// Vd) draft logits (a chain has a draft line less than target lines, a tree one per context).
struct CallLogits {
  CallLogits(const at::Tensor& target_logits, const std::optional<at::Tensor>& draft_logits, int64_t draft_extra, const char* target_shape,
             const char* draft_shape, bool allow_2d = false);
  Logits target;
  int64_t batch, lines;
  std::optional<Logits> draft;
  int64_t draft_lines, draft_vocab;  // (Vd = V without a draft)
};

float row_float(const at::Tensor& t, int64_t b);
int64_t row_int(const at::Tensor& t, int64_t b);

// Ids of a (B, L) int32 / int64 tensor, any strides.
class IdReader {
 public:
  IdReader() = default;
  IdReader(const at::Tensor& ids, const char* name);
  int64_t operator()(int64_t b, int64_t i) const {
    const int64_t off = b * stride0_ + i * stride1_;
    return is_long_ ? reinterpret_cast<const int64_t*>(base_)[off] : reinterpret_cast<const int32_t*>(base_)[off];
  }

 private:
  const char* base_ = nullptr;
  bool is_long_ = true;
  int64_t stride0_ = 0, stride1_ = 0;
};

// The per-row inputs every call has: parameters and the random stream's key and offset.
struct RowTensors {
  const at::Tensor& temperature;
  const at::Tensor& top_k;
  const at::Tensor& top_p;
  const std::optional<at::Tensor>& seeds;    // None: key base_key + b
  const std::optional<at::Tensor>& offsets;  // None: 0
  int64_t base_key;
};
void check_row_tensors(const RowTensors& t, int64_t batch);

struct RowInputs {
  LineParams params;  // (a greedy row's: inv_t 1, no filter)
  uint32_t key0 = 0, key1 = 0;
  uint64_t offset = 0;
  bool bad = false;  // a parameter out of range, a negative seed or offset
};

// Row b's parameters, key (seeds[b], else base_key + b, in int64 arithmetic as the reference) and
// offset, and the value checks that need no logits (check=True has raised in Python already).
RowInputs read_row(const RowTensors& t, int64_t b);

}  // namespace specdec
