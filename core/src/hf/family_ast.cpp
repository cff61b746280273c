// Audio Spectrogram Transformer folders: Kaldi fbank patches as the linear stem, CLS and
// distillation rows, classifier on their mean; the audio plugin from preprocessor_config.json.
#include "import.h"

namespace tessera::hf::imp {

bool read_ast(Build& b) {
  Ctx& c = b.c;
  const json& cfg = b.cfg;
  const Json& J = b.J;
  const std::string& cfg_path = b.cfg_path;
  Folder& out = b.out;
  ModelConfig& m = b.m;
  Layout& layout = b.layout;
  auto& po = b.out.plugin_options;
  bool ok = b.common(NormPlacement::pre, "layer_norm_eps", 1e-12);
  const std::string p = b.base_prefix("embeddings.patch_embeddings.projection.weight");
  ok = activation_of(c, cfg_path, "hidden_act", J.s("hidden_act", "gelu"), &m.activation) && ok;
  const int64_t patch = J.i("patch_size", 16, 1, bound::kPatch),
                fs_ = J.i("frequency_stride", 10, 1, bound::kPatch),
                ts = J.i("time_stride", 10, 1, bound::kPatch);
  const int64_t mels = J.i("num_mel_bins", 128, 1, bound::kMels),
                frames = J.i("max_length", 1024, 1, bound::kPositions);
  if (fs_ != ts)
    c.err(cfg_path + ": frequency_stride " + std::to_string(fs_) + " differs from time_stride " +
          std::to_string(ts) + " (the audio plugin cuts patches with one stride)");
  if (patch <= 0 || fs_ <= 0 || ts <= 0 || mels < patch || frames < patch) {
    c.err(cfg_path + ": patch_size, strides, num_mel_bins and max_length do not make any patch");
    return false;
  }
  const int64_t fp = (mels - patch) / fs_ + 1, tp = (frames - patch) / ts + 1;
  m.final_norm = true;
  m.d_ff = J.i("intermediate_size", std::nullopt, 1, bound::kFf);
  m.positions.kind = PositionKind::learned;
  m.positions.max_len = fp * tp + 2;
  m.stem.kind = StemKind::features;
  m.stem.n_features = patch * patch;
  m.stem.cls = true;
  m.stem.dist = true;
  layout.qkv_bias = J.b("qkv_bias", true);
  m.head.pool = PoolKind::cls_dist;
  if (b.has_tensor("classifier.dense.weight")) {
    m.head.kind = HeadKind::classifier;
    m.head.n_classes = num_labels(cfg, J);
    m.head.labels = labels_of(cfg, m.head.n_classes);
    m.head.norm = true;
  } else {
    m.head.kind = HeadKind::pool;
  }
  out.plugin = "audio";
  po.emplace_back("recipe", "ast");
  po.emplace_back("rows", "patches");
  po.emplace_back("special_rows", "2");
  po.emplace_back("n_mels", std::to_string(mels));
  po.emplace_back("patch_size", std::to_string(patch));
  po.emplace_back("patch_stride", std::to_string(fs_));
  json pp;
  if (b.tok_file("preprocessor_config.json", "the feature extractor's frames, mean and std").size() &&
      read_json(c, "preprocessor_config.json", &pp)) {
    const std::string pf = c.at("preprocessor_config.json");
    const Json P{&c, &pp, pf};
    const int64_t pf_frames = P.i("max_length", frames, 1, bound::kPositions);
    if (pf_frames != frames && c.bad_values == 0)
      c.err(pf + ": max_length " + std::to_string(pf_frames) + " frames, but config.json's max_length is " +
            std::to_string(frames));
    const int64_t pf_mels = P.i("num_mel_bins", mels, 1, bound::kMels);
    if (pf_mels != mels && c.bad_values == 0)
      c.err(pf + ": num_mel_bins " + std::to_string(pf_mels) + " but config.json's is " +
            std::to_string(mels));
    if (P.i("sampling_rate", 16000, 1, bound::kRate) != 16000)
      c.err(pf + ": sampling_rate other than 16000 is not implemented");
    po.emplace_back("target_frames", std::to_string(frames));
    if (P.b("do_normalize", true)) {
      po.emplace_back("ast_mean", fmt(P.f("mean", -4.2677393, -1e6, 1e6)));
      po.emplace_back("ast_std", fmt(P.f("std", 4.5689974, 0.0, 1e6, true)));
    } else {  // (x - 0) / (2 · 0.5) leaves the features as they are
      po.emplace_back("ast_mean", "0");
      po.emplace_back("ast_std", "0.5");
    }
  }
  return ok;
}

}  // namespace tessera::hf::imp
