// Per-task outputs, shards and the merge. See writers.h.
#include "writers.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "heatmap.h"
#include "tessera/npy.h"

namespace tessera::run {

namespace fs = std::filesystem;

namespace {

const char* role_name(uint8_t r) {
  static const char* names[] = {"content", "cls", "eos", "pad", "mask", "sep", "bos", "unk"};
  return r < 8 ? names[r] : "?";
}

void sort_by_item(std::vector<json>* records) {
  std::stable_sort(records->begin(), records->end(),
                   [](const json& a, const json& b) { return a["item"].get<int64_t>() < b["item"].get<int64_t>(); });
}

}  // namespace

json provenance_json(const Sequence& s) {
  json rows = json::array();
  for (int64_t i = 0; i < s.rows.size(); ++i) {
    const tsr_provenance& p = s.rows.provenance[static_cast<size_t>(i)];
    json r = {{"role", role_name(s.rows.roles[static_cast<size_t>(i)])},
              {"pos", {s.rows.positions[static_cast<size_t>(i)][0], s.rows.positions[static_cast<size_t>(i)][1]}}};
    const bool token_row = s.kinds.empty() ? s.rows.kind == TSR_ROWS_IDS : s.kinds[static_cast<size_t>(i)] == 0;
    if (token_row && !s.rows.ids.empty()) r["token"] = s.rows.ids[static_cast<size_t>(i)];  // as the model sees it
    switch (p.kind) {
      case TSR_PROV_BYTES: r["bytes"] = {static_cast<int64_t>(p.x0), static_cast<int64_t>(p.x1)}; break;
      case TSR_PROV_PIXELS: r["pixels"] = {p.x0, p.y0, p.x1, p.y1}; break;
      case TSR_PROV_TIME_FREQ: r["seconds"] = {p.x0, p.x1}, r["mel_bands"] = {p.y0, p.y1}; break;
      case TSR_PROV_RESIDUE: r["residues"] = {static_cast<int64_t>(p.x0), static_cast<int64_t>(p.x1)}; break;
      default: break;
    }
    if (!s.modality.empty()) r["plugin"] = s.modality[static_cast<size_t>(i)];
    rows.push_back(std::move(r));
  }
  return rows;
}

Writers::Writers(const Experiment& exp, fs::path dir, const std::vector<DataItem>& items,
                 std::vector<std::string> class_names, int64_t batch_size, const Encoder* score_decoder)
    : exp_(exp),
      dir_(std::move(dir)),
      items_(items),
      class_names_(std::move(class_names)),
      batch_size_(batch_size),
      score_decoder_(score_decoder) {}

std::string Writers::sequences_leaf() const {
  const TaskKind task = exp_.task.kind;
  return task == TaskKind::classify || task == TaskKind::score ? "predictions.jsonl"
         : task == TaskKind::generate                         ? "completions.jsonl"
                                                              : "index.jsonl";
}

std::string Writers::class_name(int64_t k) const {
  return k < static_cast<int64_t>(class_names_.size()) ? class_names_[static_cast<size_t>(k)] : std::to_string(k);
}

json Writers::sequence_record(const Sequence& s) const {
  const DataItem& item = items_[static_cast<size_t>(s.item)];
  json r = {{"t", "seq"}, {"id", s.id}, {"item", s.item}, {"rows", s.rows.size()}};
  if (!item.name.empty()) r["name"] = item.name;
  if (item.label) r["label"] = *item.label;
  return r;
}

json Writers::error_record(const ItemError& e) {
  json r = {{"t", "error"}, {"item", e.item}, {"id", e.id}, {"reason", e.reason}};
  if (!e.file.empty()) r["file"] = e.file;
  return r;
}

Status Writers::sequence_records(const Sequence* seqs, size_t n_seqs, const Placed& placed, const Outputs& out,
                                 const Tensor& probs, const std::vector<bool>& skip, std::vector<json>* records) const {
  const ModelConfig& m = exp_.model;
  const TaskKind task = exp_.task.kind;
  records->assign(n_seqs, json());
  for (size_t i = 0; i < n_seqs; ++i) {
    if (skip[i]) continue;
    const Sequence& s = seqs[i];
    const auto [b, start] = placed.at[i];
    const int64_t n = s.rows.size();
    json r = sequence_record(s);
    if (task == TaskKind::classify) {
      const int64_t K = m.head.n_classes;
      std::vector<int64_t> order(static_cast<size_t>(K));
      for (int64_t c = 0; c < K; ++c) order[static_cast<size_t>(c)] = c;
      const float* p = probs.data<float>() + static_cast<int64_t>(i) * K;
      std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b2) { return p[a] > p[b2]; });
      int64_t listed = K;
      if (!m.head.tasks.empty()) {  // a multi-task head: the sequence's task and its own classes only
        std::string why;
        const int32_t t = sequence_task(exp_, &s, 1, &why);
        if (t >= 0) {
          const HeadTask& ht = m.head.tasks[static_cast<size_t>(t)];
          r["task"] = ht.name;
          order.erase(std::remove_if(order.begin(), order.end(),
                                     [&](int64_t k) { return k < ht.first || k >= ht.first + static_cast<int64_t>(ht.labels.size()); }),
                      order.end());
          listed = static_cast<int64_t>(order.size());
        }
      }
      json top = json::array();
      for (int64_t j = 0; j < std::min<int64_t>(exp_.task.top_k, listed); ++j)
        top.push_back({{"class", class_name(order[static_cast<size_t>(j)])},
                       {"index", order[static_cast<size_t>(j)]},
                       {"prob", p[order[static_cast<size_t>(j)]]}});
      r["top"] = top;
    }
    if (task == TaskKind::score) {
      // log p(x_1..x_{n-1} | x_0) from the logits of each row for the next row's id.
      const int64_t V = m.stem.vocab_size;
      double ll = 0;
      std::vector<double> lp(static_cast<size_t>(V));
      auto log_softmax = [&, b = b, start = start](int64_t t) {  // clang 14 cannot capture structured bindings
        const float* z = out.logits.data<float>() + ((b * out.logits.dim(1)) + start + t) * V;
        double mx = -INFINITY, sum = 0;
        for (int64_t v = 0; v < V; ++v) mx = std::max<double>(mx, z[v]);
        for (int64_t v = 0; v < V; ++v) sum += std::exp(z[v] - mx);
        for (int64_t v = 0; v < V; ++v) lp[static_cast<size_t>(v)] = z[v] - mx - std::log(sum);
      };
      for (int64_t t = 0; t + 1 < n; ++t) {
        log_softmax(t);
        ll += lp[static_cast<size_t>(s.rows.ids[static_cast<size_t>(t + 1)])];
      }
      log_softmax(n - 1);
      std::vector<int64_t> order(static_cast<size_t>(V));
      for (int64_t v = 0; v < V; ++v) order[static_cast<size_t>(v)] = v;
      const int64_t K = std::min<int64_t>(exp_.task.top_k, V);
      std::partial_sort(order.begin(), order.begin() + K, order.end(), [&](int64_t a, int64_t b2) {
        return lp[static_cast<size_t>(a)] > lp[static_cast<size_t>(b2)] ||
               (lp[static_cast<size_t>(a)] == lp[static_cast<size_t>(b2)] && a < b2);
      });
      json next = json::array();
      for (int64_t j = 0; j < K; ++j) {
        const int32_t id = static_cast<int32_t>(order[static_cast<size_t>(j)]);
        json e = {{"id", id}, {"prob", std::exp(lp[static_cast<size_t>(id)])}};
        if (score_decoder_) {
          Result<std::string> text = score_decoder_->decode({id});
          if (text.ok()) e["text"] = *text;
        }
        next.push_back(e);
      }
      r["log_likelihood"] = ll;
      r["perplexity"] = n > 1 ? std::exp(-ll / static_cast<double>(n - 1)) : 1.0;
      r["next"] = next;
    }
    if (exp_.outputs.provenance) r["prov"] = provenance_json(s);
    (*records)[i] = std::move(r);
    if (!exp_.task.attention.layers.empty()) TSR_RETURN_IF_ERROR(write_attention(s, b, start, out));
  }
  return Status::Ok();
}

std::vector<int64_t> Writers::attention_heads() const {
  std::vector<int64_t> heads = exp_.task.attention.heads;
  if (heads.empty())
    for (int64_t h = 0; h < exp_.model.n_heads; ++h) heads.push_back(h);
  return heads;
}

Status Writers::write_attention(const Sequence& s, int64_t b, int64_t start, const Outputs& out) const {
  const int64_t n = s.rows.size();
  const std::vector<int64_t> heads = attention_heads();
  const std::string base = (dir_ / "attention" / safe_name(s.id)).string();
  for (int64_t layer : exp_.task.attention.layers) {
    // (B, heads, T, T): the forward kept the chosen heads only, in this order (capture_heads).
    const Tensor w = out.captured.at("blocks." + std::to_string(layer) + ".attn.weights");
    Tensor maps = Tensor::empty({static_cast<int64_t>(heads.size()), n, n});
    for (size_t i = 0; i < heads.size(); ++i)
      maps.select(0, static_cast<int64_t>(i))
          .copy_from(w.select(0, b).select(0, static_cast<int64_t>(i)).slice(0, start, start + n).slice(1, start, start + n));
    const std::string stem = base + ".layer" + std::to_string(layer);
    TSR_RETURN_IF_ERROR(npy::save(stem + ".npy", maps));
    if (!exp_.task.attention.png) continue;
    for (size_t i = 0; i < heads.size(); ++i) {
      const float* a = maps.data<float>() + static_cast<int64_t>(i) * n * n;
      RgbImage img;
      if (s.rows.picture.width > 0) {
        // What the summary row looks at (the CLS row, else the average query), over the picture.
        int64_t q = -1;
        for (int64_t r = 0; r < n && q < 0; ++r)
          if (s.rows.roles[static_cast<size_t>(r)] == TSR_ROLE_CLS) q = r;
        std::vector<float> wrow(static_cast<size_t>(n), 0.f);
        for (int64_t r = 0; r < n; ++r)
          if (q < 0 || r == q)
            for (int64_t j = 0; j < n; ++j) wrow[static_cast<size_t>(j)] += a[r * n + j];
        if (s.picture_end < 0) {
          img = heatmap_over_picture(s.rows, wrow);
        } else {  // a multimodal sequence: only the rows of the plugin that drew the picture
          TokenRows on = s.rows;
          for (int64_t r = 0; r < n; ++r)
            if (r < s.picture_begin || r >= s.picture_end) on.provenance[static_cast<size_t>(r)].kind = TSR_PROV_NONE;
          img = heatmap_over_picture(on, wrow);
        }
      } else {
        img = heatmap_matrix(a, static_cast<int>(n));
      }
      Result<std::string> png = encode_png(img);
      if (!png.ok()) return png.status();
      TSR_RETURN_IF_ERROR(write_file_atomic(stem + ".head" + std::to_string(heads[i]) + ".png", *png));
    }
  }
  return Status::Ok();
}

Status Writers::write_shard(int64_t k, std::vector<json> records, const Tensor& values) const {
  sort_by_item(&records);
  std::string lines;
  for (const json& r : records) lines += jsonl_line(r);
  const fs::path shard = dir_ / "shards" / batch_name(k);
  std::error_code ec;
  if (values.defined()) TSR_RETURN_IF_ERROR(npy::save(shard.string() + ".npy", values));
  else fs::remove(shard.string() + ".npy", ec);  // a batch redone with no sequence left: not its earlier rows
  return write_file_atomic(shard.string() + ".jsonl", lines);
}

bool Writers::has_values() const { return exp_.task.kind == TaskKind::embed || exp_.task.kind == TaskKind::hidden; }

Result<Writers::Shard> Writers::read_shard(int64_t k) const {
  const fs::path shard = dir_ / "shards" / batch_name(k);
  const std::string path = shard.string() + ".jsonl";
  std::error_code ec;
  if (!fs::exists(path, ec)) return Status::NotFound(path + " is missing");
  Result<std::string> text = read_file(path);
  if (!text.ok()) return text.status();
  const int64_t begin = k * batch_size_;
  const int64_t end = std::min<int64_t>(begin + batch_size_, static_cast<int64_t>(items_.size()));
  const bool hidden = exp_.task.kind == TaskKind::hidden;
  Shard out;
  int64_t rows = 0, sequences = 0;  // what the records say the values hold
  for (size_t pos = 0, line = 1; pos < text->size(); ++line) {
    const size_t eol = text->find('\n', pos);
    const std::string at = path + ":" + std::to_string(line) + ": ";
    if (eol == std::string::npos) return Status::ParseError(at + "the last line is cut short (it has no end of line)");
    json r = json::parse(text->substr(pos, eol - pos), nullptr, false);
    pos = eol + 1;
    if (r.is_discarded() || !r.is_object()) return Status::ParseError(at + "not a JSON object (cut short or overwritten)");
    const bool seq = r.contains("t") && r["t"] == "seq", error = r.contains("t") && r["t"] == "error";
    if (!seq && !error) return Status::ParseError(at + "\"t\" is neither \"seq\" nor \"error\"");
    if (!r.contains("item") || !r["item"].is_number_integer() || r["item"].get<int64_t>() < begin ||
        r["item"].get<int64_t>() >= end)
      return Status::ParseError(at + "\"item\" is not an item of batch " + std::to_string(k) + " (" +
                                std::to_string(begin) + " to " + std::to_string(end - 1) + ")");
    if (!r.contains("id") || !r["id"].is_string()) return Status::ParseError(at + "\"id\" is not a string");
    if (seq) {
      if (!r.contains("rows") || !r["rows"].is_number_integer() || r["rows"].get<int64_t>() < 0 ||
          r["rows"].get<int64_t>() > (int64_t{1} << 40))
        return Status::ParseError(at + "\"rows\" is not a count of rows");
      if (hidden && (!r.contains("start") || !r["start"].is_number_integer() || r["start"].get<int64_t>() != rows))
        return Status::ParseError(at + "\"start\" is not " + std::to_string(rows) + ", where the rows before it end");
      if (r.contains("prov") && !r["prov"].is_array()) return Status::ParseError(at + "\"prov\" is not a list");
      rows += r["rows"].get<int64_t>();
      ++sequences;
    } else if (!r.contains("reason") || !r["reason"].is_string()) {
      return Status::ParseError(at + "\"reason\" is not a string");
    }
    out.records.push_back(std::move(r));
  }
  if (!has_values()) return out;
  const int64_t want = hidden ? rows : sequences;
  const std::string npy_path = shard.string() + ".npy";
  if (!fs::exists(npy_path, ec)) {
    if (want == 0) return out;
    return Status::NotFound(npy_path + " is missing (" + path + " names " + std::to_string(want) + " rows of it)");
  }
  if (want == 0) return Status::Invalid(npy_path + " holds vectors, but " + path + " names no sequence");
  Result<Tensor> v = npy::load(npy_path);
  if (!v.ok()) return v.status();
  if (v->shape().rank() != 2 || v->dim(0) != want || v->dtype() != DType::f32)
    return Status::Invalid(npy_path + " is not " + std::to_string(want) + " rows of float32 vectors, as " + path +
                           " says");
  out.values = std::move(v).value();
  return out;
}

Status Writers::check_shard(int64_t k) const { return read_shard(k).status(); }

Status Writers::merge(int64_t batches, int64_t* sequences, int64_t* failed) const {
  // The shards, in batch order, into the run's outputs.
  const TaskKind task = exp_.task.kind;
  std::string seq_lines, rows, errors;
  std::vector<Tensor> parts;
  std::vector<std::string> ids;  // of the sequences written
  int64_t total = 0;             // rows of the shards before this one
  for (int64_t k = 0; k < batches; ++k) {
    Result<Shard> shard = read_shard(k);
    if (!shard.ok())
      return shard.status().with_prefix("finishing the run (a shard changed while the run held the folder; continue "
                                        "with --resume, which redoes it)");
    const int64_t base = total;  // hidden: a shard's starts count from its first row, the outputs' from the run's
    if (shard->values.defined()) {
      if (!parts.empty() && shard->values.dim(1) != parts[0].dim(1))
        return Status::Invalid("finishing the run: " + (dir_ / "shards" / batch_name(k)).string() + ".npy has vectors " +
                               std::to_string(shard->values.dim(1)) + " wide, the shards before it " +
                               std::to_string(parts[0].dim(1)) + "; continue with --resume, which redoes it");
      total += shard->values.dim(0);
      parts.push_back(shard->values);
    }
    for (json& r : shard->records) {
      if (r["t"] == "error") {
        r.erase("t");
        errors += jsonl_line(r);
        ++*failed;
        continue;
      }
      ++*sequences;
      ids.push_back(r["id"].get<std::string>());
      if (r.contains("start")) r["start"] = base + r["start"].get<int64_t>();
      if (r.contains("prov")) {
        rows += jsonl_line(json({{"id", r["id"]}, {"rows", r["prov"]}}));
        r.erase("prov");
      }
      r.erase("t");
      seq_lines += jsonl_line(r);
    }
  }
  const std::string values_leaf = task == TaskKind::hidden ? "hidden.npy" : "embeddings.npy";
  if (!parts.empty()) {
    Tensor all = Tensor::empty({total, parts[0].dim(1)});
    int64_t at = 0;
    for (const Tensor& p : parts) {
      all.slice(0, at, at + p.dim(0)).copy_from(p);
      at += p.dim(0);
    }
    TSR_RETURN_IF_ERROR(npy::save((dir_ / values_leaf).string(), all));
  } else if (has_values()) {
    TSR_RETURN_IF_ERROR(npy::save((dir_ / values_leaf).string(), Tensor::zeros({0, exp_.model.d_model})));
  }
  TSR_RETURN_IF_ERROR(write_file_atomic((dir_ / sequences_leaf()).string(), seq_lines));
  if (exp_.outputs.provenance) TSR_RETURN_IF_ERROR(write_file_atomic((dir_ / "rows.jsonl").string(), rows));
  TSR_RETURN_IF_ERROR(write_file_atomic((dir_ / "errors.jsonl").string(), errors));
  return prune_attention(ids);
}

Status Writers::unmerge(const std::set<int64_t>& keep) const {
  const TaskKind task = exp_.task.kind;
  const std::string leaf = sequences_leaf();
  auto lines_of = [&](const std::string& name, bool with_item, std::vector<json>* out) -> Status {
    const std::string path = (dir_ / name).string();
    Result<std::string> text = read_file(path);
    if (!text.ok()) return text.status();
    for (size_t pos = 0, line = 1; pos < text->size(); ++line) {
      size_t eol = text->find('\n', pos);
      if (eol == std::string::npos) eol = text->size();
      json r = json::parse(text->substr(pos, eol - pos), nullptr, false);
      if (r.is_discarded() || !r.is_object() || !r.contains("id") ||
          (with_item && !(r.contains("item") && r["item"].is_number_integer())))
        return Status::ParseError(path + ":" + std::to_string(line) + ": not a line this run wrote; start over with --force");
      out->push_back(std::move(r));
      pos = eol + 1;
    }
    return Status::Ok();
  };
  std::vector<json> seqs, errors, prov;
  TSR_RETURN_IF_ERROR(lines_of(leaf, true, &seqs));
  TSR_RETURN_IF_ERROR(lines_of("errors.jsonl", true, &errors));
  if (exp_.outputs.provenance) {
    TSR_RETURN_IF_ERROR(lines_of("rows.jsonl", false, &prov));
    if (prov.size() != seqs.size())
      return Status::Invalid((dir_ / "rows.jsonl").string() + " has " + std::to_string(prov.size()) + " lines for " +
                             std::to_string(seqs.size()) + " sequences in " + leaf + "; start over with --force");
  }
  Tensor values;  // embeddings (one row per sequence) or hidden rows
  const bool with_values = task == TaskKind::embed || task == TaskKind::hidden;
  if (with_values) {
    const std::string path = (dir_ / (task == TaskKind::hidden ? "hidden.npy" : "embeddings.npy")).string();
    Result<Tensor> v = npy::load(path);
    if (!v.ok()) return v.status();
    if (v->shape().rank() != 2 || v->dtype() != DType::f32)
      return Status::Invalid(path + " is not a (rows, width) array of float32 vectors, as this run wrote it; start "
                             "over with --force");
    values = std::move(v).value();
  }
  std::map<int64_t, std::vector<json>> records;                           // per batch, as its shard
  std::map<int64_t, std::vector<std::pair<int64_t, int64_t>>> row_spans;  // per batch: its rows of values
  std::map<int64_t, int64_t> rows_in;                                     // per batch: hidden rows so far
  int64_t row = 0;
  for (size_t i = 0; i < seqs.size(); ++i) {
    json r = std::move(seqs[i]);
    const int64_t k = r["item"].get<int64_t>() / batch_size_;
    const int64_t n = task == TaskKind::hidden ? r.value("rows", int64_t{0}) : task == TaskKind::embed ? 1 : 0;
    if (n < 0 || (with_values && n > values.dim(0) - row))
      return Status::Invalid((dir_ / leaf).string() + ":" + std::to_string(i + 1) + ": " + std::to_string(n) +
                             " rows from row " + std::to_string(row) + ", beyond the outputs' " +
                             std::to_string(with_values ? values.dim(0) : 0) + "; start over with --force");
    if (task == TaskKind::hidden) {
      if (r.value("start", int64_t{-1}) != row)
        return Status::Invalid((dir_ / leaf).string() + ":" + std::to_string(i + 1) + ": start " +
                               std::to_string(r.value("start", int64_t{-1})) + ", but the rows before it end at " +
                               std::to_string(row) + "; start over with --force");
      r["start"] = rows_in[k];
      rows_in[k] += n;
    }
    if (exp_.outputs.provenance) {
      if (prov[i]["id"] != r["id"])
        return Status::Invalid((dir_ / "rows.jsonl").string() + ":" + std::to_string(i + 1) + " is not the rows of " +
                               r["id"].dump() + "; start over with --force");
      r["prov"] = prov[i].value("rows", json::array());
    }
    r["t"] = "seq";
    records[k].push_back(std::move(r));
    if (n > 0) row_spans[k].emplace_back(row, n);
    row += n;
  }
  if (with_values && row != values.dim(0))
    return Status::Invalid((dir_ / leaf).string() + " names " + std::to_string(row) + " rows, but the outputs hold " +
                           std::to_string(values.dim(0)) + "; start over with --force");
  for (json& r : errors) {
    r["t"] = "error";
    records[r["item"].get<int64_t>() / batch_size_].push_back(std::move(r));
  }
  for (int64_t k : keep) {
    Tensor v;
    if (with_values && !row_spans[k].empty()) {
      int64_t n = 0;
      for (const auto& [at, len] : row_spans[k]) n += len;
      v = Tensor::empty({n, values.dim(1)});
      int64_t to = 0;
      for (const auto& [at, len] : row_spans[k]) {
        v.slice(0, to, to + len).copy_from(values.slice(0, at, at + len));
        to += len;
      }
    }
    TSR_RETURN_IF_ERROR(write_shard(k, std::move(records[k]), v));
  }
  return Status::Ok();
}

// Removes the attention files of sequences that are not in the outputs (an item redone since:
// it gives fewer windows, or fails now), so that attention/ holds the maps of the outputs' rows.
Status Writers::prune_attention(const std::vector<std::string>& ids) const {
  if (exp_.task.attention.layers.empty()) return Status::Ok();
  const std::vector<int64_t> heads = attention_heads();
  std::set<std::string> names;  // what write_attention() writes
  for (const std::string& id : ids)
    for (int64_t layer : exp_.task.attention.layers) {
      const std::string stem = safe_name(id) + ".layer" + std::to_string(layer);
      names.insert(stem + ".npy");
      if (exp_.task.attention.png)
        for (int64_t h : heads) names.insert(stem + ".head" + std::to_string(h) + ".png");
    }
  std::error_code ec;
  std::vector<fs::path> stale;
  for (auto it = fs::directory_iterator(dir_ / "attention", ec); !ec && it != fs::directory_iterator(); it.increment(ec))
    if (it->is_regular_file(ec) && !names.count(it->path().filename().string())) stale.push_back(it->path());
  for (const fs::path& f : stale)
    if (!fs::remove(f, ec) && ec) return Status::IoError(f.string() + ": cannot remove it: " + ec.message());
  return Status::Ok();
}

Result<std::vector<std::string>> class_names(const Experiment& exp) {
  if (exp.task.kind != TaskKind::classify) return std::vector<std::string>{};
  if (exp.task.labels.empty()) return exp.model.head.labels;
  std::vector<std::string> names;
  Result<std::string> text = read_file(exp.task.labels);
  if (!text.ok()) return text.status();
  std::string line;
  for (char c : *text + "\n") {
    if (c == '\n') {
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (!line.empty()) names.push_back(line);
      line.clear();
    } else {
      line += c;
    }
  }
  if (static_cast<int64_t>(names.size()) != exp.model.head.n_classes)
    return Status::Invalid(exp.task.labels + ": " + std::to_string(names.size()) + " labels for " +
                           std::to_string(exp.model.head.n_classes) + " classes (model.head.n_classes)");
  return names;
}

}  // namespace tessera::run
