// `tessera search EXP QUERY...`: nearest neighbours of each query among the embeddings an `embed`
// run of the same experiment wrote. The queries go through the experiment's own plugin and model,
// so they land in the same space as the run's items; similarity is the cosine.
//
//   tessera run configs/experiments/semantic_search.yaml
//   tessera search configs/experiments/semantic_search.yaml "a large natural stream of water"
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "common.h"
#include "tessera/npy.h"
#include "tessera/plugins.h"

namespace tessera::cli {

namespace {

struct SearchArgs {
  std::string file, run_dir;
  std::vector<std::string> queries, overrides;
  int top_k = 5;
  bool json = false;
};

// The text of a lines dataset's item "file:LINE", for display; "" for other datasets.
std::string item_text(const std::string& id, const std::vector<std::string>& lines) {
  const auto colon = id.rfind(':');
  if (colon == std::string::npos || lines.empty()) return "";
  char* end = nullptr;
  const long n = std::strtol(id.c_str() + colon + 1, &end, 10);
  return *end == 0 && n >= 1 && static_cast<size_t>(n) <= lines.size() ? lines[static_cast<size_t>(n - 1)] : "";
}

int run_search(const SearchArgs& a) {
  std::optional<Loaded> L = load_and_build(a.file, a.overrides);
  if (!L) return load_failure_exit_code();
  const Experiment& e = L->exp;
  if (e.plugins.size() != 1) {
    std::fprintf(stderr, "tessera search: %s has %zu plugins; search embeds queries with exactly one\n",
                 a.file.c_str(), e.plugins.size());
    return kExitBadInput;
  }
  const ModelConfig& m = e.model;
  if (m.head.kind != HeadKind::pool && m.head.kind != HeadKind::classifier) {
    std::fprintf(stderr, "tessera search: the model's head is %s; search needs pooled vectors (head.kind pool)\n",
                 head_kind_name(m.head.kind));
    return kExitBadInput;
  }
  namespace fs = std::filesystem;
  const fs::path run = !a.run_dir.empty()       ? fs::path(a.run_dir)
                       : !e.outputs.dir.empty() ? fs::path(e.outputs.dir)
                                                : fs::path("runs") / fs::path(e.file).stem();  // as tessera run
  std::ifstream mf(run / "manifest.json");
  const nlohmann::json manifest = nlohmann::json::parse(mf, nullptr, false);
  if (!manifest.is_object() || manifest.value("state", "") != "complete" || manifest.value("task", "") != "embed") {
    std::fprintf(stderr, "tessera search: %s holds no complete embed run; run `tessera run %s` first\n",
                 run.c_str(), a.file.c_str());
    return kExitBadInput;
  }
  Result<Tensor> emb = npy::load((run / "embeddings.npy").string());
  if (!emb.ok()) {
    std::fprintf(stderr, "tessera search: %s\n", emb.status().message().c_str());
    return kExitBadInput;
  }
  std::vector<std::string> ids;
  std::ifstream idx(run / "index.jsonl");
  for (std::string line; std::getline(idx, line);) {
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    ids.push_back(j.is_object() ? j.value("id", "") : "");
  }
  if (static_cast<int64_t>(ids.size()) != emb->dim(0) || emb->rank() != 2 || emb->dim(1) != m.d_model) {
    std::fprintf(stderr, "tessera search: %s: embeddings.npy %s does not match index.jsonl (%zu lines) and d_model %lld\n",
                 run.c_str(), emb->shape().str().c_str(), ids.size(), static_cast<long long>(m.d_model));
    return kExitBadInput;
  }
  std::vector<std::string> lines;  // a text file's lines, to show the neighbours
  if (!e.data.path.empty() && fs::is_regular_file(e.data.path) && fs::file_size(e.data.path) < (256u << 20) &&
      (e.data.format == DataFormat::lines || e.data.format == DataFormat::auto_detect)) {
    std::ifstream in(e.data.path);
    for (std::string l; std::getline(in, l);) lines.push_back(l);
  }

  Result<std::shared_ptr<const Plugin>> plugin = Plugin::load(e.plugins[0].file);
  Result<Encoder> enc = plugin.ok() ? Encoder::create(*plugin, e.plugins[0].options) : Result<Encoder>(plugin.status());
  if (!enc.ok()) {
    std::fprintf(stderr, "tessera search: %s\n", enc.status().message().c_str());
    return kExitBadInput;
  }
  const int64_t N = emb->dim(0), C = m.d_model;
  const Tensor E = emb->contiguous();
  nlohmann::json all = nlohmann::json::array();
  for (const std::string& q : a.queries) {
    std::string bytes = q;
    PluginItem item;
    item.id = "query";
    if (plugin.value()->input_kind() == TSR_INPUT_FILE) {  // images, sounds: the query is a path
      std::ifstream in(q, std::ios::binary);
      if (!in) {
        std::fprintf(stderr, "tessera search: query %s: cannot read the file\n", q.c_str());
        return kExitBadInput;
      }
      bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
      item.source = q;
    }
    item.data = bytes;
    Result<std::vector<TokenRows>> rows = enc->encode(item);
    if (!rows.ok() || rows->size() != 1) {
      std::fprintf(stderr, "tessera search: query \"%s\": %s\n", q.c_str(),
                   rows.ok() ? "the plugin gave more than one sequence" : rows.status().message().c_str());
      return kExitBadInput;
    }
    const TokenRows& r = (*rows)[0];
    Batch batch;
    if (r.kind == TSR_ROWS_IDS) batch = Batch::from_ids(r.ids);
    else batch = Batch::from_rows(r.features);
    batch.roles = Tensor::zeros({1, r.size()}, DType::u8);
    std::copy(r.roles.begin(), r.roles.end(), batch.roles.data<uint8_t>());
    Outputs out;
    if (Status st = L->model.forward(batch, {}, &out); !st.ok()) {
      std::fprintf(stderr, "tessera search: query \"%s\": %s\n", q.c_str(), st.message().c_str());
      return kExitFailure;
    }
    const float* v = out.pooled.data<float>();
    double nv = 0;
    for (int64_t k = 0; k < C; ++k) nv += static_cast<double>(v[k]) * v[k];
    std::vector<std::pair<double, int64_t>> scored;
    scored.reserve(static_cast<size_t>(N));
    for (int64_t i = 0; i < N; ++i) {
      const float* x = E.data<float>() + i * C;
      double dot = 0, nx = 0;
      for (int64_t k = 0; k < C; ++k) {
        dot += static_cast<double>(v[k]) * x[k];
        nx += static_cast<double>(x[k]) * x[k];
      }
      scored.emplace_back(nv > 0 && nx > 0 ? dot / std::sqrt(nv * nx) : 0.0, i);
    }
    const size_t k = std::min<size_t>(static_cast<size_t>(std::max(a.top_k, 1)), scored.size());
    std::partial_sort(scored.begin(), scored.begin() + static_cast<std::ptrdiff_t>(k), scored.end(),
                      [](const auto& x, const auto& y) { return x.first > y.first || (x.first == y.first && x.second < y.second); });
    nlohmann::json hits = nlohmann::json::array();
    if (!a.json) std::printf("%s\n", q.c_str());
    for (size_t j = 0; j < k; ++j) {
      const auto [score, i] = scored[j];
      const std::string text = item_text(ids[static_cast<size_t>(i)], lines);
      hits.push_back({{"id", ids[static_cast<size_t>(i)]}, {"cosine", score}, {"text", text}});
      if (!a.json)
        std::printf("  %.4f  %s%s%s\n", score, ids[static_cast<size_t>(i)].c_str(), text.empty() ? "" : "  ",
                    text.c_str());
    }
    all.push_back({{"query", q}, {"neighbours", hits}});
  }
  if (a.json)
    for (const auto& j : all) std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  return kExitOk;
}

}  // namespace

void add_search_command(CLI::App& app, std::function<int()>* run) {
  auto a = std::make_shared<SearchArgs>();
  CLI::App* cmd = app.add_subcommand(
      "search", "Nearest neighbours of queries among an embed run's items (cosine), queries embedded alike");
  cmd->add_option("experiment", a->file, "the experiment whose embed run to search (tessera run it first)")
      ->required();
  cmd->add_option("queries", a->queries, "texts (or, for file plugins, files) to look up")->required();
  cmd->add_option("-k,--top-k", a->top_k, "neighbours per query")->check(CLI::PositiveNumber);
  cmd->add_option("--out", a->run_dir, "the run folder, if `tessera run --out` put it elsewhere");
  cmd->add_option("--set", a->overrides, "override a config key: key.path=value (repeatable)");
  cmd->add_flag("--json", a->json, "one JSON line per query instead of the table");
  cmd->callback([a, run] { *run = [a] { return run_search(*a); }; });
}

}  // namespace tessera::cli
