// Standalone tests of the per-ISA kernel loops (csrc/kernel_*.cpp), without torch, so they also
// run for other architectures (aarch64 under qemu-user) and for the AVX-512 variant on any x86
// CPU (built with -DSPECDEC_EMULATE_AVX512). Built and run by csrc/tests/run_kernel_tests.sh.
//
// Checks, for every variant this binary can run:
// * Philox4x32-10: Random123's known answers; the vectorised race words (groups of four ids per
//   evaluation, and id lists) equal the scalar definition for random keys, positions and streams;
// * the race: the winner of argmax r / E equals a plain scalar evaluation of the same formulas, over
//   bonus and residual races (the chain's max(p - q, 0), a tree's max(p - c q, 0) [y not in S],
//   block verification's max(c p - q, 0)), dense and one-hot drafts, exclusions, temperatures,
//   filters, storage types and peaked / flat / masked lines (so every pruning path runs), also with
//   the shared bound seeded at the winner's own value; AVX2 and AVX-512 agree bit for bit;
// * residual masses: sum r over a range and over an id list against a float64 sum of the same
//   values; AVX2 and AVX-512 agree bit for bit;
// * line statistics: max / NaN / argmax, the normaliser against float64 (relative error), the value
//   histogram (its buckets, masses, unchanged normaliser), the candidates of a filtered line and a
//   top-p window (values inside, count and mass above), the top-p masses.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "fastmath.h"
#include "kernel.h"
#include "philox.h"

using namespace specdec;

namespace {

int g_checks = 0;
int g_failures = 0;

#define CHECK(cond, ...)                                       \
  do {                                                         \
    ++g_checks;                                                \
    if (!(cond)) {                                             \
      ++g_failures;                                            \
      if (g_failures <= 30) {                                  \
        std::printf("FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond); \
        std::printf(__VA_ARGS__);                              \
        std::printf("\n");                                     \
      }                                                        \
    }                                                          \
  } while (0)

bool cpu_has(const char* feature) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  __builtin_cpu_init();
  if (std::strcmp(feature, "avx2") == 0) return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("bmi2");
  if (std::strcmp(feature, "avx512") == 0)
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
#endif
  (void)feature;
  return false;
}

std::vector<const Kernels*> variants() {
  std::vector<const Kernels*> found = {base::kernels()};
#if defined(SPECDEC_EMULATE_AVX512)
  const bool avx512 = true;
#else
  const bool avx512 = cpu_has("avx512");
#endif
  if (cpu_has("avx2") && avx2::kernels() != base::kernels()) found.push_back(avx2::kernels());
  if (avx512 && avx512::kernels() != base::kernels()) found.push_back(avx512::kernels());
  return found;
}

uint16_t to_bf16(float x) {  // round to nearest even
  uint32_t u = fastmath::float_to_bits(x);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

uint16_t to_f16(float x) {
  // Rounds to nearest in the normal range, flushes what would be subnormal to zero: any half value
  // does, since the tests compare against the values the kernels decode (Line::widened).
  const uint32_t u = fastmath::float_to_bits(x);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const int32_t exponent = static_cast<int32_t>((u >> 23) & 0xFF) - 127 + 15;
  const uint32_t mantissa = u & 0x7FFFFFu;
  if (((u >> 23) & 0xFF) == 0xFF) return static_cast<uint16_t>(sign | 0x7C00u | (mantissa ? 0x200u : 0u));
  if (exponent <= 0) return static_cast<uint16_t>(sign);
  if (exponent >= 31) return static_cast<uint16_t>(sign | 0x7C00u);
  uint32_t half = (static_cast<uint32_t>(exponent) << 10) | (mantissa >> 13);
  const uint32_t rest = mantissa & 0x1FFFu;
  if (rest > 0x1000u || (rest == 0x1000u && (half & 1u))) ++half;
  return static_cast<uint16_t>(sign | half);
}

// A logits line in one of the storage types, with its float32 view.
struct Line {
  int32_t dtype = kF32;
  std::vector<float> f32;
  std::vector<uint16_t> half;
  std::vector<float> widened;  // the values the kernels see
  const void* data() const { return dtype == kF32 ? static_cast<const void*>(f32.data()) : static_cast<const void*>(half.data()); }
};

Line make_line(const std::vector<float>& values, int32_t dtype) {
  Line line;
  line.dtype = dtype;
  line.f32 = values;
  line.widened.resize(values.size());
  if (dtype == kF32) {
    line.widened = values;
  } else {
    line.half.resize(values.size());
    for (size_t i = 0; i < values.size(); ++i) {
      line.half[i] = dtype == kBF16 ? to_bf16(values[i]) : to_f16(values[i]);
      line.widened[i] = dtype == kBF16 ? fastmath::bf16_to_float(line.half[i]) : fastmath::half_to_float(line.half[i]);
    }
  }
  return line;
}

enum Shape { kNormal, kPeaked, kFlat, kMasked, kWide };

std::vector<float> random_logits(std::mt19937_64& rng, int64_t n, Shape shape) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(n);
  for (auto& v : x) v = normal(rng);
  std::uniform_int_distribution<int64_t> pick(0, n - 1);
  switch (shape) {
    case kNormal:
      for (auto& v : x) v *= 3.0f;
      break;
    case kPeaked:  // an LLM-like line: a few dominant ids over a long tail
      for (auto& v : x) v *= 2.0f;
      for (int i = 0; i < 3; ++i) x[pick(rng)] = 14.0f + 2.0f * i;
      break;
    case kFlat:
      for (auto& v : x) v = 0.25f * std::round(v);
      break;
    case kMasked:
      for (size_t i = 0; i < x.size(); ++i) {
        if (rng() % 10 < 8) x[i] = -fastmath::kPosInf;
      }
      x[pick(rng)] = 1.0f;
      break;
    case kWide:
      for (auto& v : x) v *= 30.0f;
      break;
  }
  return x;
}

// ---------------------------------------------------------------------------------------------

void test_known_answers() {
  struct Case {
    uint32_t c[4], k[2], w[4];
  } cases[] = {
      {{0, 0, 0, 0}, {0, 0}, {0x6627E8D5u, 0xE169C58Du, 0xBC57AC4Cu, 0x9B00DBD8u}},
      {{0xFFFFFFFFu, 0xFFFFFFFFu, 0xFFFFFFFFu, 0xFFFFFFFFu}, {0xFFFFFFFFu, 0xFFFFFFFFu}, {0x408F276Du, 0x41C83B0Eu, 0xA20BC7C6u, 0x6D5451FDu}},
      {{0x243F6A88u, 0x85A308D3u, 0x13198A2Eu, 0x03707344u}, {0xA4093822u, 0x299F31D0u}, {0xD16CFE09u, 0x94FDCCEBu, 0x5001E420u, 0x24126EA1u}},
  };
  for (const Case& t : cases) {
    uint32_t w[4];
    philox::words4(t.c[0], t.c[1], t.c[2], t.c[3], t.k[0], t.k[1], w);
    for (int i = 0; i < 4; ++i) CHECK(w[i] == t.w[i], "word %d: %08x != %08x", i, w[i], t.w[i]);
  }
  // The uniform's open interval ends.
  CHECK(philox::to_uniform(0) == std::ldexp(1.0f, -24), "u(0)");
  CHECK(philox::to_uniform(0xFFFFFFFFu) == 1.0f - std::ldexp(1.0f, -24), "u(max)");
}

RaceArgs random_counters(std::mt19937_64& rng) {
  RaceArgs a{};
  a.key0 = static_cast<uint32_t>(rng());
  a.key1 = static_cast<uint32_t>(rng()) & 0x3FFFFFFFu;
  a.p_lo = static_cast<uint32_t>(rng());
  a.p_hi = rng() % 2 ? static_cast<uint32_t>(rng() % 1000) : 0u;
  a.stream = 1 + static_cast<uint32_t>(rng() % 2);
  return a;
}

void test_race_words(const Kernels& k, std::mt19937_64& rng) {
  for (int trial = 0; trial < 40; ++trial) {
    RaceArgs a = random_counters(rng);
    const int64_t n = 16 * (1 + static_cast<int64_t>(rng() % 40));
    const uint32_t v0 = 4u * static_cast<uint32_t>(rng() % (1u << 20));
    std::vector<uint32_t> out(n), ids(n), out_list(n);
    k.race_words(&a, v0, n, out.data());
    for (int64_t i = 0; i < n; ++i) {
      const uint32_t want = philox::race_word(v0 + static_cast<uint32_t>(i), a.p_lo, a.p_hi, a.stream, a.key0, a.key1);
      CHECK(out[i] == want, "%s groups: id %u word %08x != %08x (n %lld)", k.name, v0 + static_cast<uint32_t>(i), out[i], want, static_cast<long long>(n));
    }
    for (int64_t i = 0; i < n; ++i) ids[i] = static_cast<uint32_t>(rng() % 300000);
    k.race_words_list(&a, ids.data(), n, out_list.data());
    for (int64_t i = 0; i < n; ++i) {
      const uint32_t want = philox::race_word(ids[i], a.p_lo, a.p_hi, a.stream, a.key0, a.key1);
      CHECK(out_list[i] == want, "%s list: id %u word %08x != %08x", k.name, ids[i], out_list[i], want);
    }
  }
}

// r(v) of a law by its definition (kernel.h: Residual), scalar arithmetic of this file's build.
float reference_residual(const Residual& a, const Line& target, const Line* draft, int64_t v) {
  const float p_inv = 1.0f / a.p_norm, q_inv = 1.0f / a.q_norm;
  float s = target.widened[v];
  if (a.inv_t != 1.0f) s = s * a.inv_t;
  float r = s >= a.p_tau ? fastmath::exp_neg(s - a.p_max) * p_inv : 0.0f;
  if (!a.residual) return r;
  r = r * a.p_scale;
  if (draft != nullptr && v < a.draft_vocab) {
    float sq = draft->widened[v];
    if (a.inv_t != 1.0f) sq = sq * a.inv_t;
    const float q = sq >= a.q_tau ? fastmath::exp_neg(sq - a.q_max) * q_inv : 0.0f;
    const float d = r - a.q_scale * q;
    r = d > 0.0f ? d : 0.0f;
  }
  for (int64_t e = 0; e < a.num_excluded; ++e) {
    if (a.excluded[e] == v) r = 0.0f;
  }
  return r;
}

// The race by the definition, one id at a time.
RaceBest reference_race(const RaceArgs& a, const Line& target, const Line* draft, const std::vector<int64_t>* only) {
  RaceBest best{0.0f, -1};
  auto visit = [&](int64_t v) {
    const float r = reference_residual(a, target, draft, v);
    const float u = philox::to_uniform(philox::race_word(static_cast<uint32_t>(v), a.p_lo, a.p_hi, a.stream, a.key0, a.key1));
    const float value = r / -fastmath::log_pos(u);
    if (value > best.value) best = {value, v};
  };
  if (only != nullptr) {
    for (int64_t v : *only) visit(v);
  } else {
    for (int64_t v = 0; v < static_cast<int64_t>(target.widened.size()); ++v) visit(v);
  }
  return best;
}

// m and z of a (widened) line by the definition, in double.
void reference_stats(const std::vector<float>& x, float inv_t, float tau, float* m_out, double* z_out) {
  float m = -fastmath::kPosInf;
  for (float v : x) m = std::max(m, inv_t == 1.0f ? v : v * inv_t);
  double z = 0.0;
  for (float v : x) {
    const float s = inv_t == 1.0f ? v : v * inv_t;
    if (s >= tau) z += std::exp(static_cast<double>(s) - static_cast<double>(m));
  }
  *m_out = m;
  *z_out = z;
}

// The race split into 8192-id chunks combined in order, as the passes run it (passes.cpp).
RaceBest chunked_race(const Kernels& k, const RaceArgs& a, int64_t vocab) {
  RaceBest best{0.0f, -1};
  for (int64_t begin = 0; begin < vocab; begin += 8192) {
    RaceBest part{0.0f, -1};
    k.race(&a, begin, std::min<int64_t>(8192, vocab - begin), &part);
    if (part.index >= 0 && part.value > best.value) best = part;
  }
  return best;
}

void test_races(const std::vector<const Kernels*>& ks, std::mt19937_64& rng) {
  const int64_t vocabs[] = {1, 5, 64, 1000, 8193, 40000, 128256};
  const Shape shapes[] = {kNormal, kPeaked, kFlat, kMasked, kWide};
  const int32_t dtypes[] = {kF32, kBF16, kF16};
  int trial = 0;
  for (int64_t vocab : vocabs) {
    for (Shape shape : shapes) {
      for (int repeat = 0; repeat < (vocab >= 40000 ? 1 : 3); ++repeat, ++trial) {
        const int32_t dtype = dtypes[trial % 3];
        const float temperature = (trial % 4 == 0) ? 0.7f : ((trial % 4 == 1) ? 1.3f : 1.0f);
        const float inv_t = 1.0f / temperature;
        Line target = make_line(random_logits(rng, vocab, shape), shape == kWide && dtype == kF16 ? kF32 : dtype);
        const int64_t draft_vocab = (trial % 5 == 0 && vocab > 1) ? vocab - 1 : vocab;
        std::vector<float> draft_values(draft_vocab);
        std::normal_distribution<float> noise(0.0f, 1.0f);
        for (int64_t v = 0; v < draft_vocab; ++v) draft_values[v] = target.f32[v] + noise(rng);
        Line draft = make_line(draft_values, target.dtype);
        RaceArgs a = random_counters(rng);
        a.target = target.data();
        a.target_dtype = target.dtype;
        a.inv_t = inv_t;
        // A filtered line in some trials: tau at a random kept count.
        float tau = -fastmath::kPosInf;
        if (trial % 3 == 2 && vocab > 4) {
          std::vector<float> sorted = target.widened;
          for (auto& v : sorted) v = inv_t == 1.0f ? v : v * inv_t;
          std::sort(sorted.begin(), sorted.end(), std::greater<float>());
          tau = sorted[rng() % std::min<int64_t>(vocab, 200)];
        }
        double z;
        reference_stats(target.widened, inv_t, tau, &a.p_max, &z);
        a.p_norm = static_cast<float>(z);
        a.p_tau = tau;
        a.residual = trial % 2 == 1;
        a.draft = nullptr;
        a.draft_dtype = kF32;
        a.draft_vocab = 0;
        a.q_max = 0.0f;
        a.q_norm = 1.0f;
        a.q_tau = -fastmath::kPosInf;
        // Residual kinds in turn: the chain's (scales 1), block verification's (p scaled by c <= 1)
        // and a tree's (q scaled by c > 0, rejected siblings excluded); one-hot drafts exclude their id.
        const int kind = (trial / 2) % 3;
        const bool one_hot = a.residual && trial % 4 == 3;
        std::vector<int64_t> excluded;
        if (a.residual && one_hot) {
          excluded.push_back(static_cast<int64_t>(rng() % static_cast<uint64_t>(vocab)));
        } else if (a.residual) {
          double zq;
          a.draft = draft.data();
          a.draft_dtype = draft.dtype;
          a.draft_vocab = draft_vocab;
          reference_stats(draft.widened, inv_t, -fastmath::kPosInf, &a.q_max, &zq);
          a.q_norm = static_cast<float>(zq);
        }
        if (a.residual && kind == 1) a.p_scale = std::ldexp(1.0f, -static_cast<int>(rng() % 6)) * 0.75f;
        if (a.residual && kind == 2) {
          a.q_scale = 0.5f + 2.0f * static_cast<float>(rng() % 1000) / 1000.0f;
          for (int e = 0; e < 3; ++e) excluded.push_back(static_cast<int64_t>(rng() % static_cast<uint64_t>(vocab)));
        }
        a.excluded = excluded.empty() ? nullptr : excluded.data();
        a.num_excluded = static_cast<int64_t>(excluded.size());
        const RaceBest want = reference_race(a, target, a.draft != nullptr ? &draft : nullptr, nullptr);
        for (size_t i = 0; i < ks.size(); ++i) {
          const Kernels& k = *ks[i];
          RaceArgs unshared = a;
          unshared.shared_best = nullptr;
          const RaceBest got = chunked_race(k, unshared, vocab);
          CHECK(got.index == want.index, "%s race V=%lld shape %d dtype %d residual %d kind %d one-hot %d: winner %lld != %lld", k.name,
                static_cast<long long>(vocab), static_cast<int>(shape), static_cast<int>(target.dtype), static_cast<int>(a.residual), kind,
                static_cast<int>(one_hot), static_cast<long long>(got.index), static_cast<long long>(want.index));
          // The shared bound seeded with the winner's own value (the tightest a seed can be) prunes
          // everything else and still finds it.
          if (want.index >= 0) {
            uint32_t seed = fastmath::float_to_bits(got.value);
            RaceArgs seeded = a;
            seeded.shared_best = &seed;
            const RaceBest pruned = chunked_race(k, seeded, vocab);
            CHECK(pruned.index == got.index, "%s seeded race: %lld != %lld", k.name, static_cast<long long>(pruned.index), static_cast<long long>(got.index));
          }
          // A kept-id list (ascending) gives the race over exactly those ids.
          std::vector<int64_t> some;
          for (int64_t v = 0; v < vocab; ++v) {
            if (rng() % 3 == 0 || v == want.index) some.push_back(v);
          }
          RaceBest listed{0.0f, -1};
          k.race_list(&unshared, some.data(), static_cast<int64_t>(some.size()), &listed);
          const RaceBest want_listed = reference_race(a, target, a.draft != nullptr ? &draft : nullptr, &some);
          CHECK(listed.index == want_listed.index, "%s race_list: %lld != %lld", k.name, static_cast<long long>(listed.index),
                static_cast<long long>(want_listed.index));
          // The residual's mass, chunked as the passes run it, and over the id list.
          double want_mass = 0.0, want_listed_mass = 0.0;
          for (int64_t v = 0; v < vocab; ++v) want_mass += static_cast<double>(reference_residual(a, target, a.draft != nullptr ? &draft : nullptr, v));
          for (int64_t v : some) want_listed_mass += static_cast<double>(reference_residual(a, target, a.draft != nullptr ? &draft : nullptr, v));
          double mass = 0.0;
          for (int64_t begin = 0; begin < vocab; begin += 8192) mass += k.residual_mass(&a, begin, std::min<int64_t>(8192, vocab - begin));
          const double listed_mass = k.residual_mass_list(&a, some.data(), static_cast<int64_t>(some.size()));
          // (The FMA variants round exp differently in the last bit: float accuracy per term.)
          CHECK(std::fabs(mass - want_mass) <= 2e-7 * want_mass + 1e-30, "%s residual_mass V=%lld kind %d: %.9g != %.9g", k.name,
                static_cast<long long>(vocab), kind, mass, want_mass);
          CHECK(std::fabs(listed_mass - want_listed_mass) <= 2e-7 * want_listed_mass + 1e-30, "%s residual_mass_list: %.9g != %.9g", k.name, listed_mass,
                want_listed_mass);
          if (std::strcmp(k.name, "avx512") == 0 && cpu_has("avx2")) {
            const Kernels& k2 = *avx2::kernels();
            const RaceBest avx2_best = chunked_race(k2, unshared, vocab);
            CHECK(avx2_best.index == got.index && fastmath::float_to_bits(avx2_best.value) == fastmath::float_to_bits(got.value),
                  "avx2 and avx512 differ: %lld %.9g vs %lld %.9g", static_cast<long long>(avx2_best.index), avx2_best.value,
                  static_cast<long long>(got.index), got.value);
            double mass2 = 0.0;
            for (int64_t begin = 0; begin < vocab; begin += 8192) mass2 += k2.residual_mass(&a, begin, std::min<int64_t>(8192, vocab - begin));
            CHECK(mass2 == mass && k2.residual_mass_list(&a, some.data(), static_cast<int64_t>(some.size())) == listed_mass,
                  "avx2 and avx512 residual masses differ: %.17g vs %.17g", mass2, mass);
          }
        }
      }
    }
  }
}

void test_stats(const Kernels& k, std::mt19937_64& rng) {
  const int64_t vocabs[] = {1, 7, 16, 100, 513, 8192, 32000, 128256};
  for (int64_t vocab : vocabs) {
    for (int32_t dtype : {kF32, kBF16, kF16}) {
      for (Shape shape : {kNormal, kPeaked, kMasked}) {
        Line line = make_line(random_logits(rng, vocab, shape), dtype);
        // scan
        ScanResult sr;
        k.scan(line.data(), dtype, vocab, true, &sr);
        float mx = -fastmath::kPosInf;
        int64_t arg = 0;
        for (int64_t i = 0; i < vocab; ++i) {
          if (line.widened[i] > mx) {
            mx = line.widened[i];
            arg = i;
          }
        }
        CHECK(sr.max == mx && sr.argmax == arg && !sr.nan, "%s scan V=%lld: %g/%lld vs %g/%lld", k.name, static_cast<long long>(vocab), sr.max,
              static_cast<long long>(sr.argmax), mx, static_cast<long long>(arg));
        // stats and the normaliser's accuracy
        for (float inv_t : {1.0f, 1.0f / 0.7f}) {
          StatsResult st;
          k.stats(line.data(), dtype, vocab, inv_t, true, &st, nullptr);
          float m;
          double z;
          reference_stats(line.widened, inv_t, -fastmath::kPosInf, &m, &z);
          CHECK(st.raw_max == mx && st.m == m && !st.nan, "%s stats max V=%lld", k.name, static_cast<long long>(vocab));
          CHECK(std::fabs(st.z - z) <= 2e-7 * z, "%s stats z V=%lld dtype %d: rel error %.3g", k.name, static_cast<long long>(vocab), dtype, std::fabs(st.z - z) / z);
          float raw_m;
          double raw_z;
          reference_stats(line.widened, 1.0f, -fastmath::kPosInf, &raw_m, &raw_z);
          CHECK(std::fabs(st.raw_z - raw_z) <= 2e-7 * raw_z, "%s stats raw z: rel error %.3g", k.name, std::fabs(st.raw_z - raw_z) / raw_z);
        }
        // collect: every value >= t, and a window [t, hi) with the count and mass above it
        if (vocab >= 16) {
          const float t = line.widened[rng() % vocab];
          const float hi = std::max(t, line.widened[rng() % vocab]);
          std::vector<float> values(vocab + 16);
          std::vector<int64_t> ids(vocab + 16);
          for (float upper : {fastmath::kPosInf, hi}) {
            CollectStats cs;
            const int64_t count = k.collect(line.data(), dtype, vocab, 1.0f, t, upper, mx, 1000, values.data(), ids.data(), &cs);
            int64_t want = 0, want_above = 0;
            double want_mass = 0.0;
            bool same = true;
            for (int64_t i = 0; i < vocab; ++i) {
              const float v = line.widened[i];
              if (v >= upper) {
                ++want_above;
                want_mass += static_cast<double>(fastmath::exp_neg(v - mx));
              } else if (v >= t) {
                same = same && want < count && ids[want] == 1000 + i && values[want] == v;
                ++want;
              }
            }
            CHECK(count == want && same && cs.max_s == mx && !cs.nan, "%s collect V=%lld hi %g: %lld vs %lld", k.name, static_cast<long long>(vocab), upper,
                  static_cast<long long>(count), static_cast<long long>(want));
            CHECK(cs.above == want_above && std::fabs(cs.above_mass - want_mass) <= 3e-7 * want_mass, "%s collect above V=%lld: %lld %.9g vs %lld %.9g",
                  k.name, static_cast<long long>(vocab), static_cast<long long>(cs.above), cs.above_mass, static_cast<long long>(want_above), want_mass);
          }
        }
        // The value histogram: the buckets (the deepest one exactly), masses to float accuracy, and
        // the normaliser bit for bit the one without it.
        for (float inv_t : {1.0f, 1.0f / 0.7f}) {
          auto hist = std::make_unique<ValueHistogram>();
          StatsResult plain, with;
          k.stats(line.data(), dtype, vocab, inv_t, false, &plain, nullptr);
          k.stats(line.data(), dtype, vocab, inv_t, false, &with, hist.get());
          CHECK(plain.z == with.z && plain.m == with.m, "%s stats with a histogram: z %.17g vs %.17g", k.name, with.z, plain.z);
          CHECK(hist->valid && hist->top == static_cast<int64_t>(std::ceil(with.m * kHistPerNat)), "%s histogram top", k.name);
          std::vector<int64_t> counts(kHistBuckets, 0);
          std::vector<double> masses(kHistBuckets, 0.0);
          const float frac = static_cast<float>(hist->top) - with.m * kHistPerNat;
          for (int64_t i = 0; i < vocab; ++i) {
            const float sv = inv_t == 1.0f ? line.widened[i] : line.widened[i] * inv_t;
            const float steps = frac - (sv - with.m) * kHistPerNat;
            const int j = static_cast<int>(steps < kHistBuckets - 1 ? steps : kHistBuckets - 1);
            ++counts[j];
            masses[j] += static_cast<double>(fastmath::exp_neg(sv - with.m));
          }
          int used = kHistBuckets;
          while (used > 0 && counts[used - 1] == 0) --used;
          bool counts_ok = hist->used == used, masses_ok = true;
          for (int j = 0; j < used && j < hist->used; ++j) {
            masses_ok = masses_ok && std::fabs(hist->mass[j] - masses[j]) <= 1e-5 * masses[j] + 1e-37;
          }
          bool clean = true;
          for (int j = 0; j < 2 * kHistBuckets; ++j) clean = clean && hist->slots[j] == 0.0f;
          CHECK(counts_ok && masses_ok && clean, "%s histogram V=%lld dtype %d: used %d vs %d (%d), masses %d, working space zero %d", k.name,
                static_cast<long long>(vocab), dtype, hist->used, used, counts_ok, masses_ok, clean);
        }
      }
    }
    // NaN and +inf are reported.
    std::vector<float> x = random_logits(rng, vocab, kNormal);
    x[rng() % vocab] = std::nanf("");
    ScanResult sr;
    k.scan(x.data(), kF32, vocab, false, &sr);
    CHECK(sr.nan, "%s scan misses a NaN (V=%lld)", k.name, static_cast<long long>(vocab));
    StatsResult st;
    k.stats(x.data(), kF32, vocab, 1.0f, false, &st, nullptr);
    CHECK(st.nan && st.z == 0.0, "%s stats misses a NaN", k.name);
  }
  // mass: float64 sums of exp(s - m).
  std::vector<float> s = random_logits(rng, 3000, kNormal);
  double want = 0.0;
  for (float v : s) want += static_cast<double>(fastmath::exp_neg(v - 12.0f));
  // (The FMA variants round exp differently in the last bit: compare at float accuracy.)
  CHECK(std::fabs(k.mass(s.data(), 3000, 12.0f) - want) <= 3e-7 * want, "%s mass", k.name);
}

// The statistics' exp (FLUSH_SUBNORMAL) gives the same bits as the race's wherever 2^n is a normal
// float, and 0 only where the race's is below the normal range, over a sweep of [-104, 0] (every
// 997th float, plus the range ends) and -inf.
void test_exp_flush() {
  constexpr int kN = 16;
  const uint32_t lo = fastmath::float_to_bits(-0.0f), hi = fastmath::float_to_bits(-104.0f);
  std::vector<float> xs;
  for (uint32_t b = lo; b <= hi; b += 997) xs.push_back(fastmath::bits_to_float(b));
  for (float x : {0.0f, -104.0f, -87.33654f, -87.33655f, -87.0f, -88.0f, -103.9f, fastmath::kNegInf}) xs.push_back(x);
  while (xs.size() % kN != 0) xs.push_back(-1.0f);
  int64_t flushed = 0;
  for (size_t i = 0; i < xs.size(); i += kN) {
    float full[kN], flush[kN];
    for (int j = 0; j < kN; ++j) full[j] = flush[j] = xs[i + j];
    fastmath::exp_neg_many<kN>(full);
    fastmath::exp_neg_many<kN, true>(flush);
    for (int j = 0; j < kN; ++j) {
      const bool same = fastmath::float_to_bits(full[j]) == fastmath::float_to_bits(flush[j]);
      const bool zeroed = flush[j] == 0.0f && full[j] < std::ldexp(1.0f, -126);
      CHECK(same || zeroed, "exp flush: x %.9g gives %.9g, the race's exp %.9g", xs[i + j], flush[j], full[j]);
      flushed += !same;
    }
  }
  CHECK(flushed > 0, "exp flush: the sweep never reached the flushed range");
}

}  // namespace

int main() {
  test_known_answers();
  test_exp_flush();
  const std::vector<const Kernels*> ks = variants();
  std::string names;
  for (const Kernels* k : ks) names += std::string(names.empty() ? "" : ", ") + k->name;
  std::printf("kernel variants: %s\n", names.c_str());
  std::mt19937_64 rng(20261201);
  for (const Kernels* k : ks) {
    test_race_words(*k, rng);
    test_stats(*k, rng);
  }
  test_races(ks, rng);
  std::printf("%d checks, %d failures\n", g_checks, g_failures);
  return g_failures == 0 ? 0 : 1;
}
