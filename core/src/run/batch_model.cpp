// The model side of a batch run: see batch_model.h.
#include "batch_model.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>

#include "tessera/machine.h"
#include "tessera/parameters.h"
#include "tessera/run.h"

namespace tessera::run {

Status BatchModel::build() {
  const MemoryPlan plan = memory_plan(exp_.model, exp_.bench.seq_len, exp_.runtime.batch_size);
  if (Status st = check_memory(plan, machine_memory()); !st.ok()) return st.with_prefix(exp_.file);
  Result<Model> m = Model::build(exp_.model);
  if (!m.ok()) return m.status().with_prefix(exp_.file);
  model_.emplace(std::move(m).value());
  return check_task();
}

// What the task needs of the model: a head and causality that fit it, the generation settings, the
// attention layers and heads it exports.
Status BatchModel::check_task() {
  const TaskKind task = exp_.task.kind;
  if (task == TaskKind::classify && exp_.model.head.kind != HeadKind::classifier)
    return Status::Invalid("task.kind classify needs a model with head.kind classifier");
  if (task == TaskKind::score && exp_.model.head.kind != HeadKind::lm)
    return Status::Invalid("task.kind score needs a language model (head.kind lm)");
  if (task == TaskKind::score && !exp_.model.causal)
    return Status::Invalid("task.kind score needs a causal model: next-token probabilities from a model that sees the "
                           "next token mean nothing (set model.arch: decoder, or model.causal: true)");
  if (task == TaskKind::generate) {
    if (exp_.model.head.kind != HeadKind::lm || !exp_.model.causal)
      return Status::Invalid("task.kind generate needs a causal language model (model.arch: decoder, head.kind lm)");
    if (exp_.runtime.packing)
      return Status::Invalid("task.kind generate decodes each batch's prompts side by side, one per batch row: set "
                             "runtime.packing: false");
    if (!exp_.task.attention.layers.empty())
      return Status::Invalid("task.kind generate exports no attention maps: remove task.attention.layers");
    Result<Encoder> dec = generation_encoder(exp_);
    if (!dec.ok()) return dec.status();
    decoder_.emplace(std::move(dec).value());
    generate_ = generate_options(exp_.task.generate);
    generate_.reference = exp_.runtime.reference;
    generate_.decode = [this](const std::vector<int32_t>& ids) { return decoder_->decode(ids); };
    TSR_RETURN_IF_ERROR(check_generate_options(generate_));
  }
  for (int64_t l : exp_.task.attention.layers)
    if (l >= exp_.model.n_layers)
      return Status::OutOfRange("task.attention.layers: layer " + std::to_string(l) + " does not exist (the model has " +
                                std::to_string(exp_.model.n_layers) + ")");
  for (int64_t h : exp_.task.attention.heads)
    if (h >= exp_.model.n_heads)
      return Status::OutOfRange("task.attention.heads: head " + std::to_string(h) + " does not exist (the model has " +
                                std::to_string(exp_.model.n_heads) + ")");
  return Status::Ok();
}

namespace {

// Why a sequence's output cannot be written: "non-finite output in <output>", and where the values
// first went wrong (`where`: the model's first layer that made them, when the forward made them).
std::string nonfinite_reason(const std::string& output, const std::string& where) {
  return "non-finite output in " + output + " (NaN or infinity)" + (where.empty() ? "" : ": " + where) +
         ": the item's outputs are not written";
}

}  // namespace

// The model over one forward chunk of a batch: per sequence, its record and its values (embed:
// its vector (1, C); hidden: its rows (n, C)), or the output that is not finite.
Status BatchModel::forward_chunk(const Sequence* seqs, size_t n_seqs, int64_t k, const Writers& writers,
                                 std::vector<SeqOutput>* outs) {
  const ModelConfig& m = exp_.model;
  const TaskKind task = exp_.task.kind;
  const Placed placed = place_sequences(m, seqs, n_seqs, exp_.runtime.packing);
  largest_forward_ = std::max<int64_t>(largest_forward_, static_cast<int64_t>(n_seqs));
  ForwardOptions fo;
  fo.reference = exp_.runtime.reference;
  for (int64_t l : exp_.task.attention.layers) fo.capture.insert("blocks." + std::to_string(l) + ".attn.weights");
  fo.capture_heads = exp_.task.attention.heads;  // empty: every head
  Outputs out;
  const auto t_model = std::chrono::steady_clock::now();
  TSR_RETURN_IF_ERROR(model_->forward(placed.batch, fo, &out).with_prefix("batch " + std::to_string(k)));
  const int64_t C = out.hidden.dim(2);
  Tensor pooled = Tensor::empty({static_cast<int64_t>(n_seqs), C});
  int64_t total_rows = 0;
  for (size_t i = 0; i < n_seqs; ++i) total_rows += seqs[i].rows.size();
  Tensor hidden;  // (rows of the chunk's sequences, C)
  if (task == TaskKind::hidden) hidden = Tensor::empty({total_rows, C});
  std::vector<int64_t> first_row;  // per sequence: its first row in `hidden`
  int64_t row_at = 0;
  for (size_t i = 0; i < n_seqs; ++i) {
    const auto [b, start] = placed.at[i];
    const int64_t n = seqs[i].rows.size();
    const Tensor h = out.hidden.select(0, b).slice(0, start, start + n);
    pool_rows(m, h, seqs[i].rows.roles.data(), pooled.data<float>() + static_cast<int64_t>(i) * C);
    if (task == TaskKind::hidden) hidden.slice(0, row_at, row_at + n).copy_from(h);
    first_row.push_back(row_at);
    row_at += n;
  }
  TSR_RETURN_IF_ERROR(model_->pool_head(pooled, fo));
  Tensor probs;
  if (task == TaskKind::classify) {
    Tensor logits;
    TSR_RETURN_IF_ERROR(model_->classify(pooled, &logits, &probs, fo));
    // A multi-task head (model.head.tasks): a sequence's probabilities over its task's classes
    // only, 0 for every other task's. A sequence of no one task keeps the softmax over all classes.
    const int64_t K = m.head.n_classes;
    for (size_t i = 0; i < n_seqs && !m.head.tasks.empty(); ++i) {
      std::string why;
      const int32_t t = sequence_task(exp_, &seqs[i], 1, &why);
      if (t < 0) continue;
      const HeadTask& ht = m.head.tasks[static_cast<size_t>(t)];
      const int64_t first = ht.first, end = ht.first + static_cast<int64_t>(ht.labels.size());
      const float* z = logits.data<float>() + static_cast<int64_t>(i) * K;
      float* p = probs.data<float>() + static_cast<int64_t>(i) * K;
      const float mx = *std::max_element(z + first, z + end);
      double sum = 0;
      for (int64_t k = first; k < end; ++k) sum += std::exp(static_cast<double>(z[k] - mx));
      for (int64_t k = 0; k < K; ++k)
        p[k] = k >= first && k < end ? static_cast<float>(std::exp(static_cast<double>(z[k] - mx)) / sum) : 0.f;
    }
  }
  model_seconds_ += seconds_since(t_model);

  // Nothing non-finite is written: each sequence's outputs checked before its record is made.
  std::vector<SeqOutput> chunk(n_seqs);
  std::vector<bool> skip(n_seqs, false);
  for (size_t i = 0; i < n_seqs; ++i) {
    const auto [b, start] = placed.at[i];
    const int64_t n = seqs[i].rows.size(), row = static_cast<int64_t>(i);
    SeqOutput& o = chunk[i];
    o.item = seqs[i].item;
    if (task == TaskKind::embed) o.values = pooled.slice(0, row, row + 1);
    if (task == TaskKind::hidden) o.values = hidden.slice(0, first_row[i], first_row[i] + n);
    std::string bad;
    if (o.values.defined() && has_nonfinite(o.values)) bad = task == TaskKind::hidden ? "hidden" : "embeddings";
    else if (task == TaskKind::classify && has_nonfinite(probs.slice(0, row, row + 1))) bad = "predictions";
    else if (task == TaskKind::score && has_nonfinite(out.logits.select(0, b).slice(0, start, start + n))) bad = "predictions";
    for (int64_t l : exp_.task.attention.layers) {
      const Tensor& w = out.captured.at("blocks." + std::to_string(l) + ".attn.weights");
      if (bad.empty() && has_nonfinite(w.select(0, b).slice(1, start, start + n).slice(2, start, start + n)))
        bad = "attention maps (layer " + std::to_string(l) + ")";
    }
    if (!bad.empty()) o.nonfinite = bad;
    skip[i] = !bad.empty();
  }
  // Only a chunk with a bad sequence pays for naming the layer: the same pass again, watched.
  if (std::find(skip.begin(), skip.end(), true) != skip.end()) {
    std::vector<NonFinite> layers;
    if (Result<std::vector<NonFinite>> f = first_nonfinite_layers(*model_, placed.batch, fo); f.ok())
      layers = std::move(f).value();
    for (size_t i = 0; i < n_seqs; ++i) {
      if (!skip[i]) continue;
      const size_t b = static_cast<size_t>(placed.at[i].first);
      const std::string where = b < layers.size() && layers[b].found() ? layers[b].describe()
                                                                       : std::string("made after the model's layers (pooler or classifier)");
      chunk[i].nonfinite = nonfinite_reason(chunk[i].nonfinite, where);
    }
  }
  std::vector<json> records;
  TSR_RETURN_IF_ERROR(writers.sequence_records(seqs, n_seqs, placed, out, probs, skip, &records));
  for (size_t i = 0; i < n_seqs; ++i) {
    chunk[i].record = std::move(records[i]);
    outs->push_back(std::move(chunk[i]));
  }
  return Status::Ok();
}

// The batch's prompts continued together (generate): one record per sequence with its completion,
// or a bad item when nothing is left of the prompt once its closing EOS row is removed.
Status BatchModel::generate_records(const Sequence* seqs, size_t n_seqs, const Writers& writers,
                                    std::vector<json>* records) {
  std::vector<std::vector<int32_t>> prompts;
  std::vector<size_t> which;  // prompts[i] is seqs[which[i]]
  GenerateOptions o = generate_;
  largest_forward_ = std::max<int64_t>(largest_forward_, static_cast<int64_t>(n_seqs));
  for (size_t i = 0; i < n_seqs; ++i) {
    std::vector<int32_t> eos;
    std::vector<int32_t> p = prompt_ids(seqs[i].rows, &eos);
    for (int32_t id : eos)  // the tokenizer's own end of text: the model's EOS
      if (std::find(o.eos_ids.begin(), o.eos_ids.end(), id) == o.eos_ids.end()) o.eos_ids.push_back(id);
    if (p.empty()) {
      records->push_back(json{{"t", "error"}, {"item", seqs[i].item}, {"id", seqs[i].id},
                              {"reason", seqs[i].id + ": the prompt has no token left once its closing special rows are "
                                                      "removed (a completion continues the text before them)"}});
      continue;
    }
    prompts.push_back(std::move(p));
    which.push_back(i);
  }
  Result<std::vector<Generation>> gens = generate(*model_, prompts, o);
  if (!gens.ok()) return gens.status();
  for (size_t g = 0; g < prompts.size(); ++g) {
    const Sequence& s = seqs[which[g]];
    const Generation& gen = (*gens)[g];
    json r = writers.sequence_record(s);
    r["completion"] = gen.text;
    r["ids"] = gen.ids;
    r["finish_reason"] = gen.finish_reason;
    if (!gen.note.empty()) r["note"] = gen.note;
    if (exp_.outputs.provenance) r["prov"] = provenance_json(s);
    records->push_back(std::move(r));
  }
  return Status::Ok();
}

// Batch k through the model in forward chunks of at most runtime.batch_size sequences (an item's
// windows may fill several). An item with an output that is not finite is a bad item: none of its
// sequences is written.
Status BatchModel::compute(int64_t k, const EncodedBatch& eb, const std::vector<DataItem>& items, const Writers& writers,
                           ShardContent* shard) {
  const std::vector<Sequence>& seqs = eb.seqs;
  const std::vector<std::pair<size_t, size_t>> chunks = forward_chunks(seqs.size(), exp_.runtime.batch_size);
  std::vector<json>& records = shard->records;
  Tensor& values = shard->values;
  if (exp_.task.kind == TaskKind::generate) {
    const auto t_model = std::chrono::steady_clock::now();
    for (const auto& [begin, end] : chunks)
      TSR_RETURN_IF_ERROR(generate_records(seqs.data() + begin, end - begin, writers, &records).with_prefix("batch " + std::to_string(k)));
    model_seconds_ += seconds_since(t_model);
  } else {
    std::vector<SeqOutput> outs;
    for (const auto& [begin, end] : chunks) TSR_RETURN_IF_ERROR(forward_chunk(seqs.data() + begin, end - begin, k, writers, &outs));
    std::map<int64_t, std::string> bad;  // item -> why its outputs are not written
    for (const SeqOutput& o : outs)
      if (!o.nonfinite.empty() && !bad.count(o.item)) bad[o.item] = o.nonfinite;
    std::vector<Tensor> parts;
    int64_t rows = 0;
    for (SeqOutput& o : outs) {
      if (bad.count(o.item)) continue;
      if (exp_.task.kind == TaskKind::hidden) o.record["start"] = rows;
      if (o.values.defined()) {
        rows += o.values.dim(0);
        parts.push_back(o.values);
      }
      records.push_back(std::move(o.record));
    }
    if (!parts.empty()) {
      values = Tensor::empty({rows, parts[0].dim(1)});
      int64_t at = 0;
      for (const Tensor& p : parts) {
        values.slice(0, at, at + p.dim(0)).copy_from(p);
        at += p.dim(0);
      }
    }
    for (const auto& [item, reason] : bad) {
      const DataItem& it = items[static_cast<size_t>(item)];
      std::string file;
      for (const ItemPart& p : it.parts)
        if (!p.missing && file.empty()) file = p.path;
      records.push_back(Writers::error_record({item, it.id, file, reason}));
    }
  }
  for (const run::ItemError& e : eb.errors) records.push_back(Writers::error_record(e));
  return Status::Ok();
}

}  // namespace tessera::run
