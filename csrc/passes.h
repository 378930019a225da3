// The parallel passes of one driver call (chain, block, tree) over its logits lines. A pass is one
// run of the scheduler (scheduler.h) over items of three kinds:
// * a chunk of a line: its statistics (m, z; a filtered line's candidates) or its validity scan;
// * a chunk of an exponential race for a row's final token (or the whole race over a filtered
//   line's kept ids);
// * a chunk of a residual's mass (a tree's Z or M after a rejection, block verification's S_i).
// After the items, each line read in the pass is combined, and a filtered line runs its further
// passes (candidates, selection: filter.cpp). Every item writes its own result slot and results
// are combined in chunk order, so nothing depends on the thread count or on the other rows.
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <vector>

#include "kernel.h"
#include "lines.h"

namespace specdec {

class Passes {
 public:
  Passes(const Kernels& k, int64_t num_lines);
  Passes(const Passes&) = delete;  // (races point into it)
  Passes& operator=(const Passes&) = delete;

  const Kernels& kernels() const { return k_; }
  Line& line(int64_t index) { return lines_[index]; }
  const Line& line(int64_t index) const { return lines_[index]; }

  // Describes line `index` before it is first read: its logits, its row's processing, whether it is
  // a draft line (a greedy row only validates those) and whether logprobs need its raw normaliser.
  void setup_line(int64_t index, const char* ptr, int32_t dtype, int64_t n, const LineParams& params, bool is_draft, bool want_raw);

  // Work of the next pass. A line is read once (a later add of a read line is ignored); scan_only
  // reads it for the validity check only.
  void add_line(int64_t index, bool scan_only);
  // The race argmax_y r(y) / E_y over line_index's vocabulary (its kept ids when it has them),
  // seeded with the race value of the line's argmax; `excluded` becomes the law's exclusions.
  // Returns the race's id.
  int64_t add_race(RaceArgs args, int64_t line_index, std::vector<int64_t> excluded = {});
  // Where `race`'s residual is zero everywhere, it runs again on `before` (with its exclusions),
  // not on p: a tree walk's residual before the rejection that ended it, whose mass it left to the
  // race.
  void set_race_fallback(int64_t race, Residual before, std::vector<int64_t> excluded = {});
  // sum_y r(y) of the law over line_index's vocabulary (its kept ids when it has them: r is 0
  // elsewhere). Returns the mass's id.
  int64_t add_mass(Residual law, int64_t line_index, std::vector<int64_t> excluded = {});
  bool pending() const { return !items_.empty(); }

  // Runs the pass (and the further passes of its filtered lines).
  void run();

  // The first id of a read line's maximum (a scan of the chunk that holds it, when the statistics
  // did not record it); -1 for a line without statistics.
  int64_t argmax(int64_t line_index) const;

  // Results of a finished pass: the race's winner (lowest id on ties; when r is 0 everywhere the
  // race runs again on its fallback, or on p, as the reference does) and the mass in float64.
  int64_t race_winner(int64_t race);
  double mass(int64_t id) const;

 private:
  struct Item {
    enum Kind : int8_t { kLineChunk, kRace, kMass, kFinishFilter };
    Kind kind;
    int32_t index;  // line, race or mass
    int32_t chunk;
  };
  struct Race {
    RaceArgs args;
    int64_t line;
    int64_t parts;
    int64_t first;                  // result slot of its first part
    std::optional<Residual> before;  // set_race_fallback's law (none: p)
  };
  struct Mass {
    Residual law;
    int64_t line;
    int64_t parts;
    int64_t first;
  };

  void add_chunks(int64_t index);
  void keep_exclusions(Residual* law, std::vector<int64_t> excluded);  // (stored here while the law is used)
  void run_items();
  void run_race_part(const RaceArgs& a, const Line& line, int64_t part, RaceBest* best) const;
  int64_t parts_of(const Line& line) const { return line.has_kept ? 1 : line.chunks; }

  const Kernels& k_;
  std::vector<Line> lines_;
  std::vector<ChunkStats> chunk_stats_;
  int64_t num_chunks_ = 0;
  std::vector<bool> queued_;
  std::vector<int64_t> pass_lines_;
  std::vector<Item> items_;
  int64_t work_ = 0;  // elements the pass touches (small work runs on the calling thread)
  std::vector<Race> races_;
  std::vector<RaceBest> race_best_;
  // RaceArgs::shared_best of each race (stable addresses): the first kInlineRaces here, then in
  // a deque made on first use (a small call allocates nothing for them).
  static constexpr int64_t kInlineRaces = 8;
  uint32_t shared_inline_[kInlineRaces] = {};
  int64_t shared_inline_used_ = 0;
  std::optional<std::deque<uint32_t>> shared_best_;
  uint32_t* new_shared_best();
  std::vector<Mass> masses_;
  std::vector<double> mass_parts_;
  std::optional<std::deque<std::vector<int64_t>>> exclusions_;  // the laws' excluded ids (stable while used; made on first use)
};

// Where a call's lines live in its Passes: the target line of (row b, position or context i) at
// b * target_per_row + i, the draft lines after all target lines.
struct LineGrid {
  int64_t batch = 0, target_per_row = 0, draft_per_row = 0;
  int64_t size() const { return batch * (target_per_row + draft_per_row); }
  int64_t target(int64_t b, int64_t i) const { return b * target_per_row + i; }
  int64_t draft(int64_t b, int64_t i) const { return batch * target_per_row + b * draft_per_row + i; }
};

// The target side of a law (p of line `target`) and, optionally, its draft side (q of `draft`).
Residual law_of(const Line& target);
void set_draft(Residual* law, const Line& draft);
// The race counters of a row's key at absolute position P on `stream`.
void set_counters(RaceArgs* args, uint32_t key0, uint32_t key1, uint64_t position, uint32_t stream);

}  // namespace specdec
