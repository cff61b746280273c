// The batcher: items -> encoded batches, and sequences -> the model's Batch. See batcher.h.
#include "batcher.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <thread>

namespace tessera::run {

Status open_encoders(const Experiment& exp, std::vector<std::shared_ptr<const Plugin>>* plugins,
                     std::vector<std::vector<Encoder>>* encoders) {
  if (exp.plugins.empty()) return Status::Invalid(exp.file + ": no plugins: list the modality plugins under plugins:");
  Diagnostics diags;
  check_plugins_fit(exp, &diags);
  if (!diags.empty()) return Status::Invalid(diags.str());
  for (const PluginConfig& pc : exp.plugins) {
    Result<std::shared_ptr<const Plugin>> p = Plugin::load(pc.file);
    if (!p.ok()) return p.status();
    plugins->push_back(*p);
  }
  const RuntimeConfig& rt = exp.runtime;
  encoders->resize(static_cast<size_t>(std::max(1, rt.workers)));
  for (std::vector<Encoder>& per_worker : *encoders)
    for (size_t i = 0; i < plugins->size(); ++i) {
      Result<Encoder> e = Encoder::create((*plugins)[i], exp.plugins[i].options);
      if (!e.ok()) return e.status();
      per_worker.push_back(std::move(e).value());
    }
  for (std::vector<Encoder>& per_worker : *encoders)
    for (Encoder& e : per_worker) TSR_RETURN_IF_ERROR(confine_encoder(e, rt));
  return Status::Ok();
}

Result<std::string> item_bytes(const ItemPart& p, int64_t max_bytes) {
  if (p.in_memory) return p.bytes;
  if (p.path.empty()) return p.text;
  if (max_bytes > 0) {
    std::error_code ec;
    const uint64_t size = p.is_text ? p.length : std::filesystem::file_size(p.path, ec);
    if (!ec && size > static_cast<uint64_t>(max_bytes))
      return Status::OutOfRange(p.path + ": " + std::to_string(size) + " bytes, more than runtime.max_item_bytes = " +
                                std::to_string(max_bytes) + "; not read (split the input, or raise runtime.max_item_bytes)");
  }
  if (!p.is_text || p.offset == 0) {
    Result<std::string> all = read_file(p.path);
    if (!all.ok() || !p.is_text || all->size() == p.length) return all;
  }
  std::ifstream f(p.path, std::ios::binary);
  std::string buf(p.length, '\0');
  if (!f || !f.seekg(static_cast<std::streamoff>(p.offset)) || !f.read(buf.data(), static_cast<std::streamsize>(p.length)))
    return Status::IoError(p.path + ": cannot read bytes " + std::to_string(p.offset) + ".." +
                           std::to_string(p.offset + p.length));
  return buf;
}

// What an item's outputs are computed from, besides the configuration: its id, name and label
// (they are written beside its outputs), the error it was listed with, and per input its file,
// first line (plugins name it in their errors) and bytes, or why they could not be read. Not the
// byte offset in a text file: editing one line leaves the other lines' items as they were.
uint64_t item_content_hash(const DataItem& item, const std::vector<Result<std::string>>& bytes) {
  uint64_t h = hash_field(item.id, kFnvOffset);
  h = hash_field(item.name, h);
  h = hash_field(item.label ? "1" + *item.label : "0", h);
  h = hash_field(item.error, h);
  h = hash_field(item.source, h);
  for (size_t p = 0; p < bytes.size(); ++p) {
    const ItemPart& part = item.parts[p];
    h = hash_field(part.missing     ? "missing"
                   : part.in_memory ? "in memory"
                   : part.is_text   ? "text"
                                    : "file",
                   h);
    h = hash_field(part.path, h);
    h = hash_field(std::to_string(part.line), h);
    h = bytes[p].ok() ? hash_field(bytes[p].value(), hash_field("bytes", h))
                      : hash_field(bytes[p].status().message(), hash_field("unreadable", h));
  }
  return h;
}

uint64_t batch_content(const std::vector<uint64_t>& item_hashes) {
  uint64_t h = kFnvOffset;
  for (uint64_t x : item_hashes) h = fnv1a(&x, sizeof x, h);
  return h;
}

Batcher::Batcher(const Experiment& exp, const std::vector<DataItem>& items,
                 std::vector<std::shared_ptr<const Plugin>> plugins, std::vector<std::vector<Encoder>>* encoders,
                 StemLayout layout, int64_t batch_size)
    : exp_(exp),
      items_(items),
      plugins_(std::move(plugins)),
      encoders_(encoders),
      layout_(std::move(layout)),
      batch_size_(batch_size) {}

int64_t Batcher::batches() const { return (static_cast<int64_t>(items_.size()) + batch_size_ - 1) / batch_size_; }

std::pair<int64_t, int64_t> Batcher::item_range(int64_t k) const {
  const int64_t begin = k * batch_size_;
  return {begin, std::min<int64_t>(begin + batch_size_, static_cast<int64_t>(items_.size()))};
}

uint64_t Batcher::content_now(int64_t k) const {
  const auto [begin, end] = item_range(k);
  std::vector<uint64_t> hashes;
  for (int64_t i = begin; i < end; ++i) {
    const DataItem& item = items_[static_cast<size_t>(i)];
    hashes.push_back(item_content_hash(item, read_parts(item, exp_.runtime.max_item_bytes)));
  }
  return batch_content(hashes);
}

void Batcher::encode_item(int64_t index, std::vector<Encoder>& encs, EncodedBatch* out) const {
  const DataItem& item = items_[static_cast<size_t>(index)];
  // Read once: what the plugins encode is what the manifest records as the item's content.
  const std::vector<Result<std::string>> bytes = read_parts(item, exp_.runtime.max_item_bytes);
  out->item_hashes.emplace_back(index, item_content_hash(item, bytes));
  ItemSequences made = run::encode_item(exp_, layout_, encs, item, index, bytes);
  if (!made.ok()) {
    out->errors.push_back({index, item.id, made.file, made.reason});
    return;
  }
  for (Sequence& s : made.seqs) out->seqs.push_back(std::move(s));
}

EncodedBatch Batcher::encode_batch(int64_t k) {
  const auto [begin, end] = item_range(k);
  const int64_t W = static_cast<int64_t>(encoders_->size());
  std::vector<EncodedBatch> parts(static_cast<size_t>(W));
  auto work = [&, begin = begin, end = end](int64_t w) {  // clang 14: no capture of structured bindings
    for (int64_t i = begin + w; i < end; i += W)
      encode_item(i, (*encoders_)[static_cast<size_t>(w)], &parts[static_cast<size_t>(w)]);
  };
  if (W == 1) {
    work(0);
  } else {
    std::vector<std::thread> threads;
    for (int64_t w = 0; w < W; ++w) threads.emplace_back(work, w);
    for (auto& t : threads) t.join();
  }
  // Back into item order, so that outputs never depend on how many workers decoded.
  EncodedBatch out;
  for (auto& p : parts) {
    for (auto& s : p.seqs) out.seqs.push_back(std::move(s));
    for (auto& e : p.errors) out.errors.push_back(std::move(e));
    out.item_hashes.insert(out.item_hashes.end(), p.item_hashes.begin(), p.item_hashes.end());
  }
  std::sort(out.item_hashes.begin(), out.item_hashes.end());
  std::vector<uint64_t> hashes;
  for (const auto& ih : out.item_hashes) hashes.push_back(ih.second);
  out.content = batch_content(hashes);
  std::stable_sort(out.seqs.begin(), out.seqs.end(), [](const Sequence& a, const Sequence& b) { return a.item < b.item; });
  std::sort(out.errors.begin(), out.errors.end(), [](const ItemError& a, const ItemError& b) { return a.item < b.item; });
  return out;
}

std::vector<std::pair<size_t, size_t>> forward_chunks(size_t n_sequences, int64_t max_sequences) {
  const size_t step = static_cast<size_t>(std::max<int64_t>(1, max_sequences));
  std::vector<std::pair<size_t, size_t>> v;
  for (size_t i = 0; i < n_sequences; i += step) v.emplace_back(i, std::min(n_sequences, i + step));
  return v;
}

Placed place_sequences(const ModelConfig& m, const Sequence* seqs, size_t n_seqs, bool packing) {
  Placed p;
  int64_t T = 0;
  for (size_t i = 0; i < n_seqs; ++i) T = std::max(T, seqs[i].rows.size());
  std::vector<int64_t> fill;
  for (size_t i = 0; i < n_seqs; ++i) {
    const Sequence& s = seqs[i];
    int64_t row = -1;
    if (packing)
      for (size_t r = 0; r < fill.size() && row < 0; ++r)
        if (fill[r] + s.rows.size() <= T) row = static_cast<int64_t>(r);
    if (row < 0) {
      row = static_cast<int64_t>(fill.size());
      fill.push_back(0);
    }
    p.at.emplace_back(row, fill[static_cast<size_t>(row)]);
    fill[static_cast<size_t>(row)] += s.rows.size();
  }
  const int64_t B = static_cast<int64_t>(fill.size());
  const bool ids = m.stem.kind == StemKind::tokens || m.stem.kind == StemKind::mixed;
  const bool feats = m.stem.kind != StemKind::tokens;
  const int64_t F = m.stem.kind == StemKind::identity ? m.d_model : m.stem.n_features;
  Batch& batch = p.batch;
  if (ids) batch.ids = Tensor::zeros({B, T}, DType::i32);
  if (feats) batch.rows = Tensor::zeros({B, T, F});
  batch.roles = Tensor::full({B, T}, TSR_ROLE_PAD).to(DType::u8);
  if (m.stem.kind == StemKind::mixed) batch.kinds = Tensor::zeros({B, T}, DType::u8);
  if (m.stem.modalities > 0) batch.modality = Tensor::zeros({B, T}, DType::i32);
  if (packing) batch.segments = Tensor::full({B, T}, -1).to(DType::i32);
  else batch.lengths.assign(static_cast<size_t>(B), 0);
  for (size_t i = 0; i < n_seqs; ++i) {
    const Sequence& s = seqs[i];
    const auto [b, start] = p.at[i];
    const int64_t n = s.rows.size();
    for (int64_t t = 0; t < n; ++t) {
      const int64_t o = b * T + start + t;
      const size_t u = static_cast<size_t>(t);
      if (ids && (s.rows.kind == TSR_ROWS_IDS || !s.kinds.empty())) batch.ids.data<int32_t>()[o] = s.rows.ids.empty() ? 0 : s.rows.ids[u];
      if (feats && s.rows.features.defined()) batch.rows.select(0, b).select(0, start + t).copy_from(s.rows.features.select(0, t));
      batch.roles.data<uint8_t>()[o] = s.rows.roles[u];
      if (batch.kinds.defined()) batch.kinds.data<uint8_t>()[o] = s.kinds.empty() ? (s.rows.kind == TSR_ROWS_FEATURES) : s.kinds[u];
      if (batch.modality.defined()) batch.modality.data<int32_t>()[o] = s.modality.empty() ? 0 : s.modality[u];
      if (packing) batch.segments.data<int32_t>()[o] = static_cast<int32_t>(i);
    }
    if (!packing) batch.lengths[static_cast<size_t>(b)] = n;
  }
  return p;
}

}  // namespace tessera::run
