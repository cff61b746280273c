// `tessera explain`: the lecture's tables for one head of one layer of any model — X, Q, K, V,
// scores, mask, weights, output — then one row worked step by step, then how the heads combine.
// It reads intermediates captured by a normal forward pass; it computes nothing on its own. With
// --item N the input is the dataset's N-th item as training encodes it, which may hold several
// plugins' rows: then the attention between the plugins' blocks of rows is summed up per head.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "commands.h"
#include "common.h"
#include "tessera/plugin.h"
#include "tessera/train.h"

namespace tessera::cli {

namespace {

struct ExplainArgs {
  std::string file;
  std::vector<std::string> overrides;
  int layer = 0, head = 0, row = -1, digits = 3;
  bool fractions = false;
  std::string ids, rows;
  int64_t item = -1;
};

std::string vec_str(const Tensor& t, int64_t row, int digits, bool frac) {  // row of a (T, D) tensor
  const int64_t D = t.dim(1);
  std::string s = D > 1 ? "(" : "";
  for (int64_t d = 0; d < D; ++d) s += (d ? ", " : "") + fmt(t.at({row, d}), digits, frac);
  return s + (D > 1 ? ")" : "");
}

// Each row's block: "[CLS]" for a CLS row, else the name of the plugin it came from.
std::vector<std::string> row_blocks(const Experiment& exp, const Batch& b, int64_t T) {
  std::vector<std::string> v;
  for (int64_t t = 0; t < T; ++t) {
    const int32_t m = b.modality.defined() ? b.modality.data<int32_t>()[t] : 0;
    const bool cls = b.roles.defined() && b.roles.data<uint8_t>()[t] == TSR_ROLE_CLS;
    v.push_back(cls ? "[CLS]" : m >= 0 && m < static_cast<int32_t>(exp.plugins.size()) ? exp.plugins[m].name : "?");
  }
  return v;
}

// The first sequence of a padded batch alone (an item that gives windows gives several).
Batch first_sequence(const Batch& b) {
  const int64_t n = b.lengths.empty() ? b.seq_len() : b.lengths[0];
  auto cut = [n](const Tensor& t) { return t.defined() ? t.slice(0, 0, 1).slice(1, 0, n).contiguous() : Tensor(); };
  Batch o;
  o.ids = cut(b.ids);
  o.rows = cut(b.rows);
  o.roles = cut(b.roles);
  o.types = cut(b.types);
  o.kinds = cut(b.kinds);
  o.modality = cut(b.modality);
  o.lengths = {n};
  return o;
}

int run_explain(const ExplainArgs& a) {
  if (a.item >= 0 && (!a.ids.empty() || !a.rows.empty())) {
    std::fprintf(stderr, "tessera explain: --item takes the input from the dataset: give it without --ids and --rows\n");
    return kExitBadInput;
  }
  // The item first: its plugins may encode in worker processes, forked before the model's threads start.
  std::optional<ExperimentItem> from_data;
  if (a.item >= 0) {
    std::optional<Experiment> exp = load(a.file, a.overrides);
    if (!exp) return kExitBadInput;
    Result<ExperimentItem> it = experiment_item(*exp, a.item);
    if (!it.ok()) {
      std::fprintf(stderr, "tessera explain: %s\n", it.status().message().c_str());
      return kExitBadInput;
    }
    from_data = std::move(it).value();
  }
  std::optional<Loaded> L = load_and_build(a.file, a.overrides);
  if (!L) return load_failure_exit_code();
  const ModelConfig& c = L->exp.model;
  std::optional<Batch> batch =
      from_data ? std::optional<Batch>(first_sequence(from_data->batch)) : input_batch(L->exp, a.ids, a.rows);
  if (!batch) return kExitBadInput;
  if (from_data)
    std::printf("item %lld: %s (%lld rows%s)\n\n", static_cast<long long>(a.item), from_data->id.c_str(),
                static_cast<long long>(batch->seq_len()),
                from_data->batch.batch_size() > 1 ? ", the first of its sequences" : "");
  if (a.layer < 0 || a.layer >= c.n_layers || a.head < 0 || a.head >= c.n_heads) {
    std::fprintf(stderr, "tessera explain: --layer %d --head %d is outside the model (%lld layers, %lld heads)\n",
                 a.layer, a.head, static_cast<long long>(c.n_layers), static_cast<long long>(c.n_heads));
    return kExitBadInput;
  }
  const std::string p = "blocks." + std::to_string(a.layer) + ".attn";
  ForwardOptions opt;
  opt.reference = L->exp.runtime.reference;
  for (const char* n : {".in", ".q", ".k", ".v", ".scores", ".mask", ".weights", ".heads", ".concat", ".out", ".residual"})
    opt.capture.insert(p + n);
  opt.capture.insert("blocks." + std::to_string(a.layer) + ".out");
  Outputs out;
  if (Status st = L->model.forward(*batch, opt, &out); !st.ok()) {
    std::fprintf(stderr, "tessera explain: %s\n", st.message().c_str());
    return kExitFailure;
  }
  auto cap = [&](const std::string& n) { return out.captured.at(p + n).select(0, 0); };  // item 0
  const Tensor X = cap(".in");
  const Tensor Q = cap(".q").select(0, a.head), K = cap(".k").select(0, a.head), V = cap(".v").select(0, a.head);
  const Tensor S = cap(".scores").select(0, a.head), M = cap(".mask"), A = cap(".weights").select(0, a.head);
  const Tensor O = cap(".heads").select(0, a.head);
  const int64_t T = X.dim(0);
  const int64_t r = a.row < 0 ? T - 1 : a.row;
  if (r >= T) {
    std::fprintf(stderr, "tessera explain: --row %d is outside the input's %lld rows\n", a.row, static_cast<long long>(T));
    return kExitBadInput;
  }
  const int dg = a.digits;
  const bool fr = a.fractions;
  std::vector<std::string> label;
  const std::vector<std::string> block = from_data ? row_blocks(L->exp, *batch, T) : std::vector<std::string>();
  for (int64_t t = 0; t < T && from_data; ++t)
    label.push_back(block[static_cast<size_t>(t)] == "[CLS]" ? "[CLS]" : block[static_cast<size_t>(t)] + "#" + std::to_string(t));
  for (int64_t t = 0; t < T && !from_data; ++t) {
    const int64_t ti = t - (L->model.rows_for(0));  // a CLS row comes first
    if (t < L->model.rows_for(0)) label.push_back("[CLS]");
    else if (ti < static_cast<int64_t>(L->exp.input.tokens.size()) && a.ids.empty() && a.rows.empty())
      label.push_back(L->exp.input.tokens[static_cast<size_t>(ti)]);
    else label.push_back("#" + std::to_string(t));
  }
  auto matrix = [&](const Tensor& m, auto cell) {
    std::vector<std::vector<std::string>> rows;
    std::vector<std::string> head{""};
    for (int64_t j = 0; j < m.dim(1); ++j) head.push_back(label[static_cast<size_t>(j)]);
    rows.push_back(head);
    for (int64_t i = 0; i < m.dim(0); ++i) {
      std::vector<std::string> row{label[static_cast<size_t>(i)]};
      for (int64_t j = 0; j < m.dim(1); ++j) row.push_back(cell(i, j));
      rows.push_back(row);
    }
    return table(rows);
  };

  std::printf("%s: layer %d, head %d of %lld  (n = %lld, d_model = %lld, d_k = %lld, d_v = %lld; %s; "
              "scale = %s)\n\n",
              a.file.c_str(), a.layer, a.head, static_cast<long long>(c.n_heads), static_cast<long long>(T),
              static_cast<long long>(c.d_model), static_cast<long long>(c.d_k), static_cast<long long>(c.d_v),
              c.causal ? "causal" : "non-causal", fmt(c.attention.scale, 4, false).c_str());

  std::vector<std::vector<std::string>> rows{{"token", "x"}};
  for (int64_t t = 0; t < T; ++t) rows.push_back({label[static_cast<size_t>(t)], vec_str(X, t, dg, fr)});
  std::printf("Input rows X (%lld x %lld)\n%s\n", static_cast<long long>(T), static_cast<long long>(X.dim(1)),
              table(rows).c_str());

  rows = {{"token", "query q", "key k", "value v"}};
  for (int64_t t = 0; t < T; ++t)
    rows.push_back({label[static_cast<size_t>(t)], vec_str(Q, t, dg, fr), vec_str(K, t, dg, fr), vec_str(V, t, dg, fr)});
  std::printf("Projections Q = X W_Q, K = X W_K, V = X W_V%s\n%s\n",
              c.positions.kind == PositionKind::rotary ? " (after rotary positions)" : "", table(rows).c_str());

  std::printf("Scores S = Q K^T * scale  (rows: queries, columns: keys)\n%s\n",
              matrix(S, [&](int64_t i, int64_t j) { return fmt(S.at({i, j}), dg, fr); }).c_str());
  std::printf("Mask M (-inf before softmax wherever not allowed)\n%s\n",
              matrix(M, [&](int64_t i, int64_t j) {
                if (M.at({i, j}) == 0.f) return std::string("allowed");
                return std::string(c.causal && j > i ? "future" : "padding");
              }).c_str());
  std::printf("Weights A = softmax(S + M), each row sums to 1\n%s\n",
              matrix(A, [&](int64_t i, int64_t j) { return fmt(A.at({i, j}), dg, fr); }).c_str());
  rows = {{"token", "output o = sum_j A_ij v_j"}};
  for (int64_t t = 0; t < T; ++t) rows.push_back({label[static_cast<size_t>(t)], vec_str(O, t, dg, fr)});
  std::printf("Head output O = A V (%lld x %lld)\n%s\n", static_cast<long long>(T),
              static_cast<long long>(O.dim(1)), table(rows).c_str());

  // One row, step by step.
  const std::string rl = label[static_cast<size_t>(r)];
  std::vector<int64_t> permitted;
  for (int64_t j = 0; j < T; ++j)
    if (M.at({r, j}) == 0.f) permitted.push_back(j);
  double smax = -INFINITY;
  for (int64_t j : permitted) smax = std::max<double>(smax, S.at({r, j}));
  const bool shift = smax > 60;  // exp would overflow the display: show exp(s - max) instead
  std::string ex = "(", total;
  double sum = 0;
  for (size_t n = 0; n < permitted.size(); ++n) {
    const double e = std::exp(S.at({r, permitted[n]}) - (shift ? smax : 0.0));
    sum += e;
    ex += (n ? ", " : "") + fmt(e, dg, fr);
  }
  std::printf("Row %s, step by step\n", rl.c_str());
  std::printf("  permitted exp(scores%s): %s); total %s\n", shift ? " - row max" : "", ex.c_str(),
              fmt(sum, dg, fr).c_str());
  rows = {{"source", "weight", "value", "weighted contribution"}};
  int64_t best = permitted.empty() ? -1 : permitted[0];
  for (int64_t j : permitted) {
    const double w = A.at({r, j});
    if (S.at({r, j}) > S.at({r, best})) best = j;
    std::string contrib = V.dim(1) > 1 ? "(" : "";
    for (int64_t d = 0; d < V.dim(1); ++d) contrib += (d ? ", " : "") + fmt(w * V.at({j, d}), dg, fr);
    rows.push_back({label[static_cast<size_t>(j)], fmt(w, dg, fr), vec_str(V, j, dg, fr), contrib + (V.dim(1) > 1 ? ")" : "")});
  }
  std::printf("%s", table(rows, 2).c_str());
  std::printf("  output for %s: %s\n", rl.c_str(), vec_str(O, r, dg, fr).c_str());
  if (best >= 0)
    std::printf("  argmax alternative: keep only the highest-scoring value (%s): %s\n\n",
                label[static_cast<size_t>(best)].c_str(), vec_str(V, best, dg, fr).c_str());

  // All heads of this layer for the row, then W_O and the residual.
  const Tensor heads = cap(".heads"), concat = cap(".concat");
  rows = {{"head", "output for " + rl}};
  for (int64_t h = 0; h < c.n_heads; ++h)
    rows.push_back({std::to_string(h), vec_str(heads.select(0, h), r, dg, fr)});
  std::printf("Layer %d, row %s: heads, concatenation, output projection, residual\n%s", a.layer, rl.c_str(),
              table(rows).c_str());
  std::printf("  concat: %s\n", vec_str(concat, r, dg, fr).c_str());
  if (c.attention.output_projection) {
    std::printf("  concat W_O + b_O: %s\n", vec_str(cap(".out"), r, dg, fr).c_str());
    if (c.residual)
      std::printf("  x + concat W_O + b_O (residual): %s\n", vec_str(cap(".residual"), r, dg, fr).c_str());
  }
  const Tensor bout = out.captured.at("blocks." + std::to_string(a.layer) + ".out").select(0, 0);
  std::printf("  block output: %s\n", vec_str(bout, r, dg, fr).c_str());

  // Several plugins in the sequence: how much each block of rows attends to each block, per head.
  std::vector<std::string> names;  // the blocks, in order of first row
  for (const std::string& b : block)
    if (std::find(names.begin(), names.end(), b) == names.end()) names.push_back(b);
  if (names.size() > 1 + static_cast<size_t>(std::count(names.begin(), names.end(), "[CLS]"))) {
    const Tensor W = cap(".weights");  // (H, T, T)
    std::printf("\nLayer %d: attention between the blocks of rows, every head (the weight a query row gives each "
                "block's keys, averaged over the block's query rows; each row of a table sums to 1)\n",
                a.layer);
    for (int64_t h = 0; h < c.n_heads; ++h) {
      std::vector<std::vector<std::string>> t{{"head " + std::to_string(h) + ": from \\ to"}};
      for (const std::string& n : names) t[0].push_back(n);
      for (const std::string& from : names) {
        std::vector<std::string> row{from};
        int64_t queries = 0;
        std::vector<double> mass(names.size(), 0.0);
        for (int64_t i = 0; i < T; ++i) {
          if (block[static_cast<size_t>(i)] != from) continue;
          ++queries;
          for (int64_t j = 0; j < T; ++j) {
            const size_t k = static_cast<size_t>(std::find(names.begin(), names.end(), block[static_cast<size_t>(j)]) - names.begin());
            mass[k] += W.at({h, i, j});
          }
        }
        for (double m : mass) row.push_back(fmt(m / static_cast<double>(queries), dg, fr));
        t.push_back(row);
      }
      std::printf("%s", table(t, 2).c_str());
    }
  }
  return kExitOk;
}

}  // namespace

void add_explain_command(CLI::App& app, std::function<int()>* run) {
  auto args = std::make_shared<ExplainArgs>();
  CLI::App* cmd = app.add_subcommand("explain", "Print the lecture's attention tables for one head of a model");
  cmd->add_option("file", args->file, "experiment YAML")->required();
  cmd->add_option("--layer", args->layer, "layer (block) index, from 0")->capture_default_str();
  cmd->add_option("--head", args->head, "head index, from 0")->capture_default_str();
  cmd->add_option("--row", args->row, "query row worked step by step (default: the last row)");
  cmd->add_option("--digits", args->digits, "decimals shown")
      ->check(CLI::Range(0, 17))
      ->capture_default_str();
  cmd->add_flag("--fractions", args->fractions, "show values near p/q (q <= 64) as fractions");
  cmd->add_option("--ids", args->ids, "token ids instead of the experiment's input, e.g. 5,17,2");
  cmd->add_option("--rows", args->rows, "feature rows (.npy, (T, F)) instead of the experiment's input");
  cmd->add_option("--item", args->item,
                  "the N-th item (from 0) of the experiment's dataset, encoded as training encodes it, instead of the "
                  "experiment's input");
  cmd->add_option("--set", args->overrides, "override a config key: key.path=value (repeatable)");
  cmd->callback([args, run] { *run = [args] { return run_explain(*args); }; });
}

}  // namespace tessera::cli
