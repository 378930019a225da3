// The extension's entry points: the operator schemas and their CPU kernels (TORCH_LIBRARY, so
// compiled graphs call the C++ kernel without Python; specdec_ext/ops.py holds the same strings
// and adds the CUDA (Triton) and fake kernels) and the Python module (pybind11), with the test and
// benchmark hooks. Every kernel runs without the GIL: other Python threads keep running.
#include <ATen/CPUGeneratorImpl.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/Generator.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/extension.h>
#include <torch/library.h>

#include <mutex>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "dispatch.h"
#include "drivers.h"
#include "passes.h"
#include "fastmath.h"
#include "kernel.h"
#include "lines.h"
#include "philox.h"
#include "scheduler.h"

// setup.py passes the torch version as a bare token (a quoted string does not survive every build
// tool's shell quoting); it is turned into a string here.
#define SPECDEC_STRINGIFY2(x) #x
#define SPECDEC_STRINGIFY(x) SPECDEC_STRINGIFY2(x)
#ifdef SPECDEC_TORCH_VERSION
#define SPECDEC_TORCH_VERSION_STRING SPECDEC_STRINGIFY(SPECDEC_TORCH_VERSION)
#else
#define SPECDEC_TORCH_VERSION_STRING "unknown"
#endif

namespace py = pybind11;

namespace specdec {

at::Tensor repetition_penalty(const at::Tensor& scores, const at::Tensor& sequences, const at::Tensor& index, const at::Tensor& start,
                              const at::Tensor& end, const std::optional<at::Tensor>& drafts, int64_t first, double penalty);

namespace {

VerifyOutputs verify_cpu(const at::Tensor& target_logits, const std::optional<at::Tensor>& draft_logits, const at::Tensor& draft_tokens,
                         const at::Tensor& temperature, const at::Tensor& top_k, const at::Tensor& top_p, const at::Tensor& num_draft_tokens,
                         const std::optional<at::Tensor>& seeds, const std::optional<at::Tensor>& offsets, int64_t base_key, int64_t stream, bool check,
                         int64_t logprobs, bool accept_probs) {
  const RowTensors rows{temperature, top_k, top_p, seeds, offsets, base_key};
  return verify_chain(target_logits, draft_logits, draft_tokens, rows, num_draft_tokens, stream, check, logprobs, accept_probs);
}

// sample = the bonus draw of verify with K = 0, raced on the sample stream.
at::Tensor sample_cpu(const at::Tensor& logits, const at::Tensor& temperature, const at::Tensor& top_k, const at::Tensor& top_p,
                      const std::optional<at::Tensor>& seeds, const std::optional<at::Tensor>& offsets, int64_t base_key) {
  check_cpu_tensor(logits, "logits");
  TORCH_CHECK_VALUE(logits.dim() == 2, "specdec: logits must be (B, V), got ", logits.sizes());
  const RowTensors rows{temperature, top_k, top_p, seeds, offsets, base_key};
  return std::get<0>(verify_chain(logits, std::nullopt, nullptr, rows, nullptr, philox::kSampleStream, /*check=*/true, kLogprobsNone, false,
                                  /*sample=*/true, nullptr));
}

// A per-call key base in [0, 2^62) from a CPU generator: the value torch.randint(0, 2**62, (1,),
// generator=generator) gives (random_(0, 2**62) on int64: random64() % 2^62 under the generator's
// lock), without a tensor and two dispatcher calls.
constexpr uint64_t kKeyBound = uint64_t{1} << 62;

int64_t draw_key(const at::Generator& generator) {
  auto* gen = generator.get<at::CPUGeneratorImpl>();
  std::lock_guard<std::mutex> lock(gen->mutex_);
  return static_cast<int64_t>(gen->random64() % kKeyBound);
}

// The CPU generator a Python argument names (None: torch's default one), or nullopt for anything
// else (a CUDA generator, not a generator: the caller's Python path decides).
std::optional<at::Generator> cpu_generator(PyObject* obj) {
  if (obj == Py_None) return at::detail::getDefaultCPUGenerator();
  if (Py_TYPE(obj) != reinterpret_cast<PyTypeObject*>(THPGeneratorClass)) return std::nullopt;
  const at::Generator& gen = reinterpret_cast<THPGenerator*>(obj)->cdata;
  if (!gen.defined() || gen.device().type() != at::kCPU) return std::nullopt;
  return gen;
}

py::object draw_base_key(py::handle generator) {
  const std::optional<at::Generator> gen = cpu_generator(generator.ptr());
  if (!gen) return py::none();
  return py::int_(draw_key(*gen));
}

at::ScalarType scalar_type(py::handle dtype) {
  TORCH_CHECK_VALUE(THPDtype_Check(dtype.ptr()), "specdec: expected a torch.dtype");
  return reinterpret_cast<THPDtype*>(dtype.ptr())->scalar_type;
}

// A dense tensor argument of exactly these sizes and dtype on this device (torch.Tensor itself,
// not a subclass that may override what a call does), or nullptr.
const at::Tensor* plain_tensor(PyObject* obj, at::IntArrayRef sizes, at::ScalarType dtype, bool int32_too = false, at::Device device = at::kCPU) {
  if (!THPVariable_CheckExact(obj)) return nullptr;
  const at::Tensor& t = THPVariable_Unpack(obj);
  if (!t.defined() || t.device() != device || t.layout() != at::kStrided) return nullptr;
  const at::ScalarType type = t.scalar_type();
  if (type != dtype && !(int32_too && type == at::kInt)) return nullptr;
  return t.sizes() == sizes ? &t : nullptr;
}

// A tensor argument of a prepared call, as its first call brought it: sizes, dtype, device and
// strides (none kept for a contiguous tensor: any contiguous tensor of these sizes will do, since
// the strides contiguity leaves free, those of size-1 dimensions, only ever multiply index 0).
struct TensorSpec {
  std::vector<int64_t> sizes, strides;
  at::ScalarType dtype = at::kFloat;
  at::Device device = at::kCPU;

  static TensorSpec of(py::handle obj) {
    TORCH_CHECK_VALUE(THPVariable_Check(obj.ptr()), "specdec: a prepared call is bound to the tensors of its first call");
    const at::Tensor& t = THPVariable_Unpack(obj.ptr());
    TensorSpec spec{t.sizes().vec(), {}, t.scalar_type(), t.device()};
    if (!t.is_contiguous()) spec.strides = t.strides().vec();
    return spec;
  }

  bool takes(PyObject* obj) const {
    const at::Tensor* t = plain_tensor(obj, sizes, dtype, false, device);
    return t != nullptr && (strides.empty() ? t->is_contiguous() : t->strides() == at::IntArrayRef(strides));
  }
};

// The host side of a prepared Triton call (specdec_ext._triton_backend.plan_runner) up to its
// launches, in one trip from Python: bound to the tensors of the plan's first call, a call checks
// its tensors against them (TensorSpec), and its seeds and offsets (each None or a contiguous (B,)
// int64 tensor on the device), then allocates its outputs on the device, under the caller's
// inference mode as torch.empty_like would. Returns None for a call it does not take, having
// allocated nothing (the general path then runs it); else the outputs: a sample's (B,) tokens, or
// verify's (tokens (B, K+1) int64, num_accepted (B,) int64, logprobs (B, K+1) float32 or None,
// accept_probs (B, K) float32 or None). The launches themselves stay in Python (Triton's launcher).
class LaunchOutputs {
 public:
  LaunchOutputs(py::handle target, py::handle draft, py::handle tokens, bool sample, bool logprobs, bool accept_probs)
      : target_(TensorSpec::of(target)), sample_(sample), logprobs_(logprobs), accept_probs_(accept_probs) {
    const int64_t batch = target_.sizes[0];
    if (!draft.is_none()) draft_ = TensorSpec::of(draft);
    if (!sample) tokens_ = TensorSpec::of(tokens);
    const int64_t length = sample ? 1 : target_.sizes[1];
    row_sizes_ = {batch};
    token_sizes_ = sample ? std::vector<int64_t>{batch} : std::vector<int64_t>{batch, length};
    position_sizes_ = {batch, length - 1};
  }

  py::object call(py::handle target, py::handle draft, py::handle tokens, py::handle seeds, py::handle offsets) const {
    if (!target_.takes(target.ptr())) return py::none();
    if (!sample_) {
      if (draft_ ? !draft_->takes(draft.ptr()) : !draft.is_none()) return py::none();
      if (!tokens_->takes(tokens.ptr())) return py::none();
    }
    if (!row_vector(seeds) || !row_vector(offsets)) return py::none();
    const at::TensorOptions ints = at::TensorOptions().dtype(at::kLong).device(target_.device);
    py::object out_tokens = wrap(at::empty(token_sizes_, ints));
    if (sample_) return out_tokens;
    const at::TensorOptions floats = ints.dtype(at::kFloat);
    return py::make_tuple(out_tokens, wrap(at::empty(row_sizes_, ints)), logprobs_ ? wrap(at::empty(token_sizes_, floats)) : py::none(),
                          accept_probs_ ? wrap(at::empty(position_sizes_, floats)) : py::none());
  }

 private:
  static py::object wrap(at::Tensor t) { return py::reinterpret_steal<py::object>(THPVariable_Wrap(std::move(t))); }

  bool row_vector(py::handle obj) const {
    if (obj.is_none()) return true;
    const at::Tensor* t = plain_tensor(obj.ptr(), row_sizes_, at::kLong, false, target_.device);
    return t != nullptr && t->is_contiguous();
  }

  TensorSpec target_;
  std::optional<TensorSpec> draft_, tokens_;
  bool sample_, logprobs_, accept_probs_;
  std::vector<int64_t> row_sizes_, token_sizes_, position_sizes_;
};

// The prepared chain call (specdec_ext.prepared.ChainPlan on the C++ backend): bound once to the
// batch shape, dtypes and per-row parameters; a call checks its arguments against them in C++,
// draws the key and runs the kernel in one trip from Python. A call it does not take (other
// shapes or dtypes, a tensor subclass, seeds or offsets that are not (B,) int64 CPU tensors, a
// generator that is not a CPU torch.Generator) returns None before it draws anything: the Python
// path then runs (and raises its errors). Returns what verify returns (logprobs / accept_probs None
// when not asked; sample: the (B,) tokens), or, with `check` when a row was blanked, a tuple with
// one more item (sample: a 1-tuple) for the Python path to raise from.
class ChainRunner {
 public:
  ChainRunner(at::Tensor temperature, at::Tensor top_k, at::Tensor top_p, int64_t batch, int64_t positions, int64_t vocab, py::handle dtype,
              int64_t draft_vocab, py::handle draft_dtype, int64_t stream, bool check, int64_t logprobs, bool accept_probs, bool sample)
      : temperature_(std::move(temperature)),
        top_k_(std::move(top_k)),
        top_p_(std::move(top_p)),
        batch_(batch),
        positions_(positions),
        dtype_(scalar_type(dtype)),
        draft_dtype_(scalar_type(draft_dtype)),
        one_hot_(draft_vocab < 0),
        stream_(stream),
        check_(check),
        logprobs_(logprobs),
        accept_probs_(accept_probs),
        sample_(sample) {
    TORCH_CHECK_VALUE(!sample || positions == 0, "specdec: a sample runner has K = 0");
    target_sizes_ = sample ? std::vector<int64_t>{batch, vocab} : std::vector<int64_t>{batch, positions + 1, vocab};
    draft_sizes_ = {batch, positions, draft_vocab};
    token_sizes_ = {batch, positions};
    row_sizes_ = {batch};
  }

  py::object call(py::handle target_obj, py::handle draft_obj, py::handle tokens_obj, py::handle seeds_obj, py::handle offsets_obj,
                  py::handle generator_obj) {
    const at::Tensor* target = plain_tensor(target_obj.ptr(), target_sizes_, dtype_);
    if (target == nullptr) return py::none();
    std::optional<at::Tensor> draft;
    const at::Tensor* tokens = nullptr;
    if (!sample_) {
      if (one_hot_ != draft_obj.is_none()) return py::none();
      if (!one_hot_) {
        const at::Tensor* d = plain_tensor(draft_obj.ptr(), draft_sizes_, draft_dtype_);
        if (d == nullptr) return py::none();
        draft = *d;
      }
      tokens = plain_tensor(tokens_obj.ptr(), token_sizes_, at::kLong, /*int32_too=*/true);
      if (tokens == nullptr) return py::none();
    }
    std::optional<at::Tensor> seeds, offsets;
    if (!seeds_obj.is_none()) {
      const at::Tensor* t = plain_tensor(seeds_obj.ptr(), row_sizes_, at::kLong);
      if (t == nullptr) return py::none();
      seeds = *t;
    }
    if (!offsets_obj.is_none()) {
      const at::Tensor* t = plain_tensor(offsets_obj.ptr(), row_sizes_, at::kLong);
      if (t == nullptr) return py::none();
      offsets = *t;
    }
    const std::optional<at::Generator> generator = cpu_generator(generator_obj.ptr());
    if (!generator) return py::none();
    const int64_t base_key = seeds ? 0 : draw_key(*generator);
    const RowTensors rows{temperature_, top_k_, top_p_, seeds, offsets, base_key};
    bool any_bad = false;
    VerifyOutputs out;
    {
      py::gil_scoped_release no_gil;
      out = verify_chain(*target, draft, tokens, rows, nullptr, sample_ ? philox::kSampleStream : stream_, check_ || sample_,
                         sample_ ? kLogprobsNone : logprobs_, !sample_ && accept_probs_, sample_, &any_bad);
    }
    const bool raise = check_ && any_bad;
    if (sample_) {
      py::object tokens_out = py::reinterpret_steal<py::object>(THPVariable_Wrap(std::move(std::get<0>(out))));
      return raise ? py::object(py::make_tuple(tokens_out)) : tokens_out;
    }
    py::tuple result(raise ? 5 : 4);
    result[0] = py::reinterpret_steal<py::object>(THPVariable_Wrap(std::move(std::get<0>(out))));
    result[1] = py::reinterpret_steal<py::object>(THPVariable_Wrap(std::move(std::get<1>(out))));
    result[2] = logprobs_ != kLogprobsNone ? py::reinterpret_steal<py::object>(THPVariable_Wrap(std::move(std::get<2>(out)))) : py::none();
    result[3] = accept_probs_ ? py::reinterpret_steal<py::object>(THPVariable_Wrap(std::move(std::get<3>(out)))) : py::none();
    if (raise) result[4] = py::bool_(true);
    return std::move(result);
  }

 private:
  at::Tensor temperature_, top_k_, top_p_;
  int64_t batch_, positions_;
  at::ScalarType dtype_, draft_dtype_;
  bool one_hot_;
  int64_t stream_;
  bool check_;
  int64_t logprobs_;
  bool accept_probs_, sample_;
  std::vector<int64_t> target_sizes_, draft_sizes_, token_sizes_, row_sizes_;
};

std::tuple<at::Tensor, at::Tensor, at::Tensor> block_verify_cpu(const at::Tensor& target_logits, const std::optional<at::Tensor>& draft_logits,
                                                                const at::Tensor& draft_tokens, const at::Tensor& temperature, const at::Tensor& top_k,
                                                                const at::Tensor& top_p, const at::Tensor& num_draft_tokens,
                                                                const std::optional<at::Tensor>& seeds, const std::optional<at::Tensor>& offsets,
                                                                int64_t base_key, bool check, int64_t logprobs) {
  const RowTensors rows{temperature, top_k, top_p, seeds, offsets, base_key};
  return verify_block_chain(target_logits, draft_logits, draft_tokens, rows, num_draft_tokens, check, logprobs);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> tree_verify_cpu(const at::Tensor& target_logits, const std::optional<at::Tensor>& draft_logits,
                                                               const at::Tensor& draft_tokens, const at::Tensor& parents, const at::Tensor& temperature,
                                                               const at::Tensor& top_k, const at::Tensor& top_p, const at::Tensor& num_nodes,
                                                               const std::optional<at::Tensor>& seeds, const std::optional<at::Tensor>& offsets,
                                                               int64_t base_key, bool without_replacement, bool check) {
  const RowTensors rows{temperature, top_k, top_p, seeds, offsets, base_key};
  return verify_tree(target_logits, draft_logits, draft_tokens, parents, rows, num_nodes, without_replacement, check);
}

// Benchmark hook (bench/bench_cpp.py): nanoseconds per bonus race (r = p, no draft) over a whole
// float32 line, on the calling thread, chunk after chunk as a verify call runs it, seeded with the
// argmax as verify seeds it (seed_argmax); a fresh key each repetition. The line statistics are
// computed once, outside the timing.
double race_ns(const at::Tensor& line, int64_t reps, bool seed_argmax) {
  TORCH_CHECK_VALUE(line.dim() == 1 && line.scalar_type() == at::kFloat && line.device().is_cpu() && line.is_contiguous(),
                    "specdec: race_ns takes a contiguous (V,) float32 CPU tensor");
  TORCH_CHECK_VALUE(reps >= 1, "specdec: reps must be >= 1");
  const Kernels& k = kernels();
  const int64_t vocab = line.size(0);
  StatsResult st;
  k.stats(line.const_data_ptr(), kF32, vocab, 1.0f, false, &st, nullptr);
  ScanResult sr;
  k.scan(line.const_data_ptr(), kF32, vocab, true, &sr);
  RaceArgs a;
  a.target = line.const_data_ptr();
  a.target_dtype = kF32;
  a.p_max = st.m;
  a.p_norm = static_cast<float>(st.z);
  a.p_lo = 7;
  a.stream = philox::kVerifyStream;
  int64_t sink = 0;
  const auto start = std::chrono::steady_clock::now();
  for (int64_t rep = 0; rep < reps; ++rep) {
    uint32_t shared = 0;
    a.key0 = static_cast<uint32_t>(rep);
    a.key1 = 0x5EEDu;
    if (seed_argmax) {
      RaceArgs probe = a;
      probe.shared_best = nullptr;
      RaceBest seed{0.0f, -1};
      k.race_list(&probe, &sr.argmax, 1, &seed);
      shared = fastmath::float_to_bits(seed.value);
    }
    a.shared_best = &shared;
    RaceBest best{0.0f, -1};
    for (int64_t begin = 0; begin < vocab; begin += kChunk) {
      RaceBest part{0.0f, -1};
      k.race(&a, begin, std::min(kChunk, vocab - begin), &part);
      if (part.index >= 0 && part.value > best.value) best = part;
    }
    sink += best.index;
  }
  const auto elapsed = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start).count();
  TORCH_CHECK(sink >= 0, "specdec: race_ns found no winner");
  return static_cast<double>(elapsed) / static_cast<double>(reps);
}

// Test hook: m and z of each line of a (N, V) float32 tensor at one temperature, through the
// chunked statistics verify uses (z as float64, before its float32 rounding).
std::tuple<at::Tensor, at::Tensor> line_stats(const at::Tensor& logits, double temperature) {
  TORCH_CHECK_VALUE(logits.dim() == 2 && logits.scalar_type() == at::kFloat && logits.device().is_cpu() && logits.is_contiguous(),
                    "specdec: line_stats takes a contiguous (N, V) float32 CPU tensor");
  const Kernels& k = kernels();
  const int64_t count = logits.size(0), n = logits.size(1);
  at::Tensor m_out = at::empty({count}, logits.options());
  at::Tensor z_out = at::empty({count}, logits.options().dtype(at::kDouble));
  for (int64_t i = 0; i < count; ++i) {
    Line line;
    line.ptr = static_cast<const char*>(logits.const_data_ptr()) + i * n * 4;
    line.dtype = kF32;
    line.n = n;
    line.mode = kStats;
    line.inv_t = temperature == 1.0 ? 1.0f : 1.0f / static_cast<float>(temperature);
    line.chunks = (n + kChunk - 1) / kChunk;
    std::vector<ChunkStats> chunks(line.chunks);
    for (int64_t c = 0; c < line.chunks; ++c) process_chunk(line, c, chunks[c], k);
    combine_chunks(line, chunks.data(), k);
    // (combine_chunks keeps z as float32 for the kernels; recombine in double for the test)
    double z = 0.0;
    for (const ChunkStats& c : chunks) {
      if (c.m > -kInf && c.z > 0.0) z += c.z * std::exp(static_cast<double>(c.m) - static_cast<double>(line.m));
    }
    m_out[i] = line.m;
    z_out[i] = z;
  }
  return {m_out, z_out};
}

// Test hook: the filter of each line of a (N, V) float32 tensor with per-line parameters, through
// the passes verify runs (chunks, top-p windows, selection): (m, tau, z) per line.
std::tuple<at::Tensor, at::Tensor, at::Tensor> line_filter(const at::Tensor& logits, const at::Tensor& temperature, const at::Tensor& top_k,
                                                           const at::Tensor& top_p) {
  TORCH_CHECK_VALUE(logits.dim() == 2 && logits.scalar_type() == at::kFloat && logits.device().is_cpu() && logits.is_contiguous(),
                    "specdec: line_filter takes a contiguous (N, V) float32 CPU tensor");
  const int64_t count = logits.size(0), n = logits.size(1);
  const std::optional<at::Tensor> none;
  const RowTensors rows{temperature, top_k, top_p, none, none, 0};
  check_row_tensors(rows, count);
  Passes passes(kernels(), count);
  for (int64_t i = 0; i < count; ++i) {
    const RowInputs row = read_row(rows, i);
    TORCH_CHECK_VALUE(!row.bad && !row.params.greedy, "specdec: line_filter takes valid sampled parameters");
    passes.setup_line(i, static_cast<const char*>(logits.const_data_ptr()) + i * n * 4, kF32, n, row.params, false, false);
    passes.add_line(i, false);
  }
  passes.run();
  at::Tensor m_out = at::empty({count}, logits.options()), tau_out = at::empty({count}, logits.options()), z_out = at::empty({count}, logits.options());
  for (int64_t i = 0; i < count; ++i) {
    const Line& line = passes.line(i);
    m_out[i] = line.bad ? std::numeric_limits<float>::quiet_NaN() : line.m;
    tau_out[i] = line.tau;
    z_out[i] = line.z;
  }
  return {m_out, tau_out, z_out};
}

std::string torch_version_at_build() { return SPECDEC_TORCH_VERSION_STRING; }

std::string compiler() {
#if defined(__clang__)
  return "clang " __clang_version__;
#elif defined(__GNUC__)
  return "gcc " __VERSION__;
#else
  return "unknown";
#endif
}

}  // namespace
}  // namespace specdec

TORCH_LIBRARY(specdec, m) {
  m.set_python_module("specdec_ext.ops");
  m.def(
      "verify(Tensor target_logits, Tensor? draft_logits, Tensor draft_tokens, Tensor temperature, Tensor top_k, Tensor top_p, "
      "Tensor num_draft_tokens, Tensor? seeds, Tensor? offsets, int base_key, int stream=1, bool check=True, int logprobs=0, "
      "bool accept_probs=False) -> (Tensor, Tensor, Tensor, Tensor)");
  m.def("sample(Tensor logits, Tensor temperature, Tensor top_k, Tensor top_p, Tensor? seeds, Tensor? offsets, int base_key) -> Tensor");
}

TORCH_LIBRARY_IMPL(specdec, CPU, m) {
  m.impl("verify", &specdec::verify_cpu);
  m.impl("sample", &specdec::sample_cpu);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "specdec_ext C++ CPU kernel";
  const auto no_gil = py::call_guard<py::gil_scoped_release>();
  m.def("verify", &specdec::verify_cpu,
        "Fused verification: (tokens (B, K+1) int64, num_accepted (B,) int64, logprobs (B, K+1) float32 or empty, accept_probs (B, K) float32 or empty)",
        py::arg("target_logits"), py::arg("draft_logits"), py::arg("draft_tokens"), py::arg("temperature"), py::arg("top_k"), py::arg("top_p"),
        py::arg("num_draft_tokens"), py::arg("seeds"), py::arg("offsets"), py::arg("base_key"), py::arg("stream") = 1, py::arg("check") = true,
        py::arg("logprobs") = 0, py::arg("accept_probs") = false, no_gil);
  m.def("sample", &specdec::sample_cpu, "One token per row (the bonus draw of verify with K = 0, on the sample stream)", py::arg("logits"),
        py::arg("temperature"), py::arg("top_k"), py::arg("top_p"), py::arg("seeds"), py::arg("offsets"), py::arg("base_key"), no_gil);
  m.def("draw_base_key", &specdec::draw_base_key,
        "A per-call key base in [0, 2**62) from a CPU generator (None: torch's default), the value torch.randint(0, 2**62, (1,)) draws; "
        "None for anything else",
        py::arg("generator"));
  py::class_<specdec::ChainRunner>(m, "ChainRunner", "A chain call (verify, token-wise, or sample) bound to its shapes, dtypes and per-row parameters")
      .def(py::init<at::Tensor, at::Tensor, at::Tensor, int64_t, int64_t, int64_t, py::handle, int64_t, py::handle, int64_t, bool, int64_t, bool, bool>(),
           py::arg("temperature"), py::arg("top_k"), py::arg("top_p"), py::arg("batch"), py::arg("positions"), py::arg("vocab"), py::arg("dtype"),
           py::arg("draft_vocab"), py::arg("draft_dtype"), py::arg("stream"), py::arg("check"), py::arg("logprobs"), py::arg("accept_probs"),
           py::arg("sample"))
      .def("__call__", &specdec::ChainRunner::call);
  py::class_<specdec::LaunchOutputs>(m, "LaunchOutputs",
                                     "A prepared Triton call's checks and output allocation, bound to the tensors of its first call")
      .def(py::init<py::handle, py::handle, py::handle, bool, bool, bool>(), py::arg("target"), py::arg("draft"), py::arg("tokens"), py::arg("sample"),
           py::arg("logprobs"), py::arg("accept_probs"))
      .def("__call__", &specdec::LaunchOutputs::call);
  m.def("block_verify", &specdec::block_verify_cpu,
        "Block verification of chains: (tokens (B, K+1) int64, num_accepted (B,) int64, logprobs (B, K+1) float32 or empty)", py::arg("target_logits"),
        py::arg("draft_logits"), py::arg("draft_tokens"), py::arg("temperature"), py::arg("top_k"), py::arg("top_p"), py::arg("num_draft_tokens"),
        py::arg("seeds"), py::arg("offsets"), py::arg("base_key"), py::arg("check") = true, py::arg("logprobs") = 0, no_gil);
  m.def("tree_verify", &specdec::tree_verify_cpu,
        "Tree verification: (tokens (B, N+1) int64, num_accepted (B,) int64, accepted_nodes (B, N) int64), -1 beyond each row's path", py::arg("target_logits"),
        py::arg("draft_logits"), py::arg("draft_tokens"), py::arg("parents"), py::arg("temperature"), py::arg("top_k"), py::arg("top_p"),
        py::arg("num_nodes"), py::arg("seeds"), py::arg("offsets"), py::arg("base_key"), py::arg("without_replacement") = false,
        py::arg("check") = true, no_gil);
  m.def("repetition_penalty", &specdec::repetition_penalty,
        "transformers' repetition penalty at every position of a (b, P, V) float32 block: position j of row b has seen "
        "sequences[index[b], start[b]:end[b]] and drafts[b, :first + j]",
        py::arg("scores"), py::arg("sequences"), py::arg("index"), py::arg("start"), py::arg("end"), py::arg("drafts"), py::arg("first"),
        py::arg("penalty"));
  m.def("isa", &specdec::isa, "The instruction-set variant in use");
  m.def("set_isa", &specdec::set_isa, "Pin a variant ('auto', 'avx512', 'avx2', 'neon', 'base'); False if this CPU lacks it");
  m.def("scheduler", &specdec::scheduler, "How work is spread over threads: 'auto' (default), 'openmp' or 'pool'");
  m.def("set_scheduler", &specdec::set_scheduler, "Choose 'auto', 'openmp' or 'pool'; False for an unknown name");
  m.def("openmp_linked", &specdec::openmp_linked, "Whether the extension runs on torch's OpenMP runtime (else 'openmp' uses the pool)");
  m.def("torch_version_at_build", &specdec::torch_version_at_build, "The torch version this extension was compiled against");
  m.def("compiler", &specdec::compiler, "The compiler that built this extension");
  m.def("race_ns", &specdec::race_ns, "Benchmark hook: ns per bonus race over a (V,) float32 line on one thread", py::arg("line"), py::arg("reps"),
        py::arg("seed_argmax") = true, no_gil);
  m.def("line_stats", &specdec::line_stats, "Test hook: (m, z as float64) of each line of (N, V) float32 logits, through verify's chunked statistics",
        py::arg("logits"), py::arg("temperature") = 1.0);
  m.def("line_filter", &specdec::line_filter, "Test hook: (m, tau, z) of each line of (N, V) float32 logits, through verify's passes and filter",
        py::arg("logits"), py::arg("temperature"), py::arg("top_k"), py::arg("top_p"), no_gil);
  m.def("scheduler_selftest", &specdec::scheduler_selftest, "Test hook: run items that throw on the caller or a helper thread", py::arg("scheduler"),
        py::arg("count"), py::arg("item_us"), py::arg("throw_on"), no_gil);
  m.def("scheduler_selftest_started", &specdec::scheduler_selftest_started, "Test hook: items of scheduler_selftest started so far");
}
