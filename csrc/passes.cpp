// The passes of a driver call (passes.h).
#include "passes.h"

#include <algorithm>

#include "fastmath.h"
#include "philox.h"
#include "scheduler.h"

namespace specdec {

Passes::Passes(const Kernels& k, int64_t num_lines) : k_(k), lines_(num_lines), queued_(num_lines, false) {
  // (a small call's items and lines fit at once: no reallocation while they are added)
  items_.reserve(2 * num_lines + 2);
  pass_lines_.reserve(num_lines);
}

uint32_t* Passes::new_shared_best() {
  if (shared_inline_used_ < kInlineRaces) {
    uint32_t* slot = &shared_inline_[shared_inline_used_++];
    *slot = 0;
    return slot;
  }
  if (!shared_best_) shared_best_.emplace();
  shared_best_->push_back(0);
  return &shared_best_->back();
}

void Passes::setup_line(int64_t index, const char* ptr, int32_t dtype, int64_t n, const LineParams& params, bool is_draft, bool want_raw) {
  Line& line = lines_[index];
  line.ptr = ptr;
  line.dtype = dtype;
  line.n = n;
  line.inv_t = params.inv_t;
  line.top_k = params.top_k;
  line.top_p = params.top_p;
  const bool filtered = !params.greedy && ((params.top_k > 0 && params.top_k < n) || params.top_p < 1.0f);
  line.mode = params.greedy ? (is_draft ? kCheck : kArgmax) : (filtered ? kFilter : kStats);
  line.want_raw = want_raw;
  line.first_chunk = num_chunks_;
  line.chunks = (n + kChunk - 1) / kChunk;
  num_chunks_ += line.chunks;
  if (line.mode == kFilter && filter_needs_stats_first(line)) line.histograms.resize(line.chunks);
}

void Passes::add_chunks(int64_t index) {
  const Line& line = lines_[index];
  for (int64_t c = 0; c < line.chunks; ++c) items_.push_back({Item::kLineChunk, static_cast<int32_t>(index), static_cast<int32_t>(c)});
  work_ += line.n;
}

void Passes::add_line(int64_t index, bool scan_only) {
  Line& line = lines_[index];
  if (queued_[index] || line.done) return;
  queued_[index] = true;
  line.scan_only = scan_only;
  pass_lines_.push_back(index);
  // A filtered line with top-k collects its candidates in this pass (the guess needs only a
  // sample); a top-p-only line reads its statistics first (its window uses the exact maximum).
  if (line.mode == kFilter && !scan_only && !filter_needs_stats_first(line)) prepare_filter_line(line, nullptr);
  add_chunks(index);
}

Residual law_of(const Line& target) {
  Residual law;
  law.target = target.ptr;
  law.target_dtype = target.dtype;
  law.inv_t = target.inv_t;
  law.p_max = target.m;
  law.p_norm = target.z;
  law.p_tau = target.tau;
  return law;
}

void set_draft(Residual* law, const Line& draft) {
  law->draft = draft.ptr;
  law->draft_dtype = draft.dtype;
  law->draft_vocab = draft.n;
  law->q_max = draft.m;
  law->q_norm = draft.z;
  law->q_tau = draft.tau;
}

void set_counters(RaceArgs* args, uint32_t key0, uint32_t key1, uint64_t position, uint32_t stream) {
  args->key0 = key0;
  args->key1 = key1;
  philox::position_words(position, &args->p_lo, &args->p_hi);
  args->stream = stream;
}

void Passes::keep_exclusions(Residual* law, std::vector<int64_t> excluded) {
  if (excluded.empty()) return;
  if (!exclusions_) exclusions_.emplace();
  exclusions_->push_back(std::move(excluded));
  law->excluded = exclusions_->back().data();
  law->num_excluded = static_cast<int64_t>(exclusions_->back().size());
}

int64_t Passes::add_race(RaceArgs a, int64_t line_index, std::vector<int64_t> excluded) {
  const Line& t = lines_[line_index];
  keep_exclusions(&a, std::move(excluded));
  // Seed the pruning bound with the race value of the target's argmax, a likely winner, so the
  // chunks skip most of a peaked vocabulary from their first block on (results do not change).
  const int64_t seed_id = argmax(line_index);
  uint32_t* shared = new_shared_best();
  if (seed_id >= 0) {
    RaceArgs probe = a;
    probe.shared_best = nullptr;
    RaceBest seed{0.0f, -1};
    k_.race_list(&probe, &seed_id, 1, &seed);
    *shared = fastmath::float_to_bits(seed.value);
  }
  a.shared_best = shared;
  const int64_t race = static_cast<int64_t>(races_.size());
  const int64_t parts = parts_of(t);
  races_.push_back({a, line_index, parts, static_cast<int64_t>(race_best_.size()), std::nullopt});
  race_best_.resize(race_best_.size() + parts, RaceBest{0.0f, -1});
  for (int64_t c = 0; c < parts; ++c) items_.push_back({Item::kRace, static_cast<int32_t>(race), static_cast<int32_t>(c)});
  work_ += t.has_kept ? static_cast<int64_t>(t.kept.size()) * 16 : t.n;
  return race;
}

void Passes::set_race_fallback(int64_t race, Residual before, std::vector<int64_t> excluded) {
  keep_exclusions(&before, std::move(excluded));
  races_[race].before = before;
}

int64_t Passes::argmax(int64_t line_index) const {
  const Line& t = lines_[line_index];
  if (t.argmax >= 0 || (t.mode != kStats && t.mode != kFilter)) return t.argmax;
  const int64_t start = t.max_chunk * kChunk;
  ScanResult sr;
  k_.scan(t.ptr + start * dtype_size(t.dtype), t.dtype, std::min(kChunk, t.n - start), true, &sr);
  return start + sr.argmax;
}

int64_t Passes::add_mass(Residual law, int64_t line_index, std::vector<int64_t> excluded) {
  const Line& t = lines_[line_index];
  keep_exclusions(&law, std::move(excluded));
  const int64_t id = static_cast<int64_t>(masses_.size());
  const int64_t parts = parts_of(t);
  masses_.push_back({law, line_index, parts, static_cast<int64_t>(mass_parts_.size())});
  mass_parts_.resize(mass_parts_.size() + parts, 0.0);
  for (int64_t c = 0; c < parts; ++c) items_.push_back({Item::kMass, static_cast<int32_t>(id), static_cast<int32_t>(c)});
  work_ += t.has_kept ? static_cast<int64_t>(t.kept.size()) : t.n;
  return id;
}

void Passes::run_race_part(const RaceArgs& a, const Line& line, int64_t part, RaceBest* best) const {
  if (line.has_kept) {
    k_.race_list(&a, line.kept.data(), static_cast<int64_t>(line.kept.size()), best);
  } else {
    k_.race(&a, part * kChunk, std::min(kChunk, line.n - part * kChunk), best);
  }
}

void Passes::run_items() {
  if (static_cast<int64_t>(chunk_stats_.size()) < num_chunks_) chunk_stats_.resize(num_chunks_);
  specdec::run_items(static_cast<int64_t>(items_.size()), work_, [&](int64_t i) {
    const Item item = items_[i];
    switch (item.kind) {
      case Item::kRace: {
        const Race& race = races_[item.index];
        RaceBest best{0.0f, -1};
        run_race_part(race.args, lines_[race.line], item.chunk, &best);
        race_best_[race.first + item.chunk] = best;
        break;
      }
      case Item::kMass: {
        const Mass& mass = masses_[item.index];
        const Line& line = lines_[mass.line];
        mass_parts_[mass.first + item.chunk] =
            line.has_kept ? k_.residual_mass_list(&mass.law, line.kept.data(), static_cast<int64_t>(line.kept.size()))
                          : k_.residual_mass(&mass.law, item.chunk * kChunk, std::min(kChunk, line.n - item.chunk * kChunk));
        break;
      }
      case Item::kFinishFilter:
        finish_filter_line(lines_[item.index], k_);
        break;
      case Item::kLineChunk: {
        Line& line = lines_[item.index];
        process_chunk(line, item.chunk, chunk_stats_[line.first_chunk + item.chunk], k_);
        break;
      }
    }
  });
  items_.clear();
  work_ = 0;
}

void Passes::run() {
  run_items();
  std::vector<int64_t> filtered;
  for (int64_t index : pass_lines_) {
    Line& line = lines_[index];
    combine_chunks(line, chunk_stats_.data() + line.first_chunk, k_);
    if (line.mode == kFilter && !line.scan_only && !line.bad) filtered.push_back(index);
  }
  // Filtered lines: a top-p-only line now collects its candidates (a second pass), then every
  // filtered line's selection runs, one item per line.
  for (int64_t index : filtered) {
    Line& line = lines_[index];
    if (!line.guess_ready) {
      prepare_filter_line(line, chunk_stats_.data() + line.first_chunk);
      add_chunks(index);
    }
  }
  if (!items_.empty()) {
    run_items();
    for (int64_t index : filtered) combine_chunks(lines_[index], chunk_stats_.data() + lines_[index].first_chunk, k_);
  }
  for (int64_t index : filtered) {
    items_.push_back({Item::kFinishFilter, static_cast<int32_t>(index), 0});
    work_ += lines_[index].n;
  }
  if (!items_.empty()) run_items();
  for (int64_t index : pass_lines_) {
    lines_[index].done = true;
    queued_[index] = false;
  }
  pass_lines_.clear();
}

int64_t Passes::race_winner(int64_t id) {
  const Race& race = races_[id];
  RaceBest best{0.0f, -1};
  for (int64_t c = 0; c < race.parts; ++c) {
    const RaceBest& part = race_best_[race.first + c];
    if (part.index >= 0 && part.value > best.value) best = part;  // chunk order: lowest id on ties
  }
  if (best.index < 0) {
    // The residual is zero everywhere: race on the residual before it (a tree walk's last
    // rejection), or on p (p equals q up to rounding), as the reference does.
    RaceArgs a = race.args;
    if (race.before) {
      static_cast<Residual&>(a) = *race.before;
    } else {
      a.residual = false;
    }
    a.shared_best = nullptr;
    for (int64_t c = 0; c < race.parts; ++c) {
      RaceBest part{0.0f, -1};
      run_race_part(a, lines_[race.line], c, &part);
      if (part.index >= 0 && part.value > best.value) best = part;
    }
  }
  return best.index >= 0 ? best.index : 0;
}

double Passes::mass(int64_t id) const {
  const Mass& mass = masses_[id];
  double total = 0.0;
  for (int64_t c = 0; c < mass.parts; ++c) total += mass_parts_[mass.first + c];
  return total;
}

}  // namespace specdec
