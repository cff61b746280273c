// ViT folders: patch Conv2d as the linear stem, CLS row, learned positions (resized for another
// image size), classifier or pooler; the image plugin from preprocessor_config.json.
#include "import.h"

namespace tessera::hf::imp {

bool read_vit(Build& b) {
  Ctx& c = b.c;
  const json& cfg = b.cfg;
  const Json& J = b.J;
  const std::string& cfg_path = b.cfg_path;
  const ImportOptions& opt = b.opt;
  Folder& out = b.out;
  ModelConfig& m = b.m;
  std::set<std::string>& ignorable = b.ignorable;
  Grid& grid = b.grid;
  Layout& layout = b.layout;
  auto& po = b.out.plugin_options;
  bool ok = b.common(NormPlacement::pre, "layer_norm_eps", 1e-12);
  const std::string p = b.base_prefix("embeddings.patch_embeddings.projection.weight");
  ok = activation_of(c, cfg_path, "hidden_act", J.s("hidden_act", "gelu"), &m.activation) && ok;
  const int64_t img = J.i("image_size", 224, 1, bound::kImage),
                patch = J.i("patch_size", 16, 1, bound::kPatch),
                ch = J.i("num_channels", 3, 1, bound::kChannels);
  if (patch <= 0 || img <= 0 || img % patch != 0) {
    c.err(cfg_path + ": patch_size " + std::to_string(patch) + " does not divide image_size " +
          std::to_string(img));
    return false;
  }
  grid.g0 = img / patch;
  int64_t ih = img, iw = img;
  if (opt.image_size.size() == 2) {
    ih = opt.image_size[0];
    iw = opt.image_size[1];
  }
  grid.gh = ih / patch;
  grid.gw = iw / patch;
  // Another size resizes the position table to (1 + gh·gw, C) here, before any memory plan: the
  // sides and the cells are bounded first (a 4096 x 4096 image in 16-pixel patches is 65536).
  if (ih < patch || iw < patch || ih > bound::kImage || iw > bound::kImage ||
      grid.gh * grid.gw > bound::kGridCells) {
    c.err("the image plugin's image_size " + std::to_string(ih) + "x" + std::to_string(iw) +
              ": expected each side in [" + std::to_string(patch) + " (patch_size), " +
              std::to_string(bound::kImage) + "] and at most " + std::to_string(bound::kGridCells) +
              " patches",
          "set a smaller image_size for the image plugin, or leave it out to use config.json's");
    return false;
  }
  if (grid.gh != grid.g0 || grid.gw != grid.g0) {
    // transformers 4.40: scale factors (side + 0.1) / grid, so that floor() lands on the side.
    grid.scale_h = (static_cast<double>(grid.gh) + 0.1) / static_cast<double>(grid.g0);
    grid.scale_w = (static_cast<double>(grid.gw) + 0.1) / static_cast<double>(grid.g0);
    out.notes.push_back("position grid " + std::to_string(grid.g0) + "x" + std::to_string(grid.g0) +
                        " resized bicubically to " + std::to_string(grid.gh) + "x" + std::to_string(grid.gw) +
                        " for " + std::to_string(ih) + "x" + std::to_string(iw) + " images");
  }
  m.final_norm = true;
  m.d_ff = J.i("intermediate_size", std::nullopt, 1, bound::kFf);
  m.positions.kind = PositionKind::learned;
  m.positions.max_len = 1 + grid.gh * grid.gw;
  m.stem.kind = StemKind::features;
  m.stem.n_features = ch * patch * patch;
  m.stem.cls = true;
  layout.qkv_bias = J.b("qkv_bias", true);
  layout.channels = ch;
  layout.grid = grid.g0;
  m.head.pool = PoolKind::cls;
  if (b.has_tensor("classifier.weight")) {
    m.head.kind = HeadKind::classifier;
    m.head.n_classes = num_labels(cfg, J);
    m.head.labels = labels_of(cfg, m.head.n_classes);
  } else {
    m.head.kind = HeadKind::pool;
  }
  if (b.has_tensor(p + "pooler.dense.weight")) {
    if (m.head.kind == HeadKind::pool) {
      m.head.pooler = true;
    } else {
      ignorable.insert(p + "pooler.dense.weight");
      ignorable.insert(p + "pooler.dense.bias");
    }
  }
  // The image plugin: the processor's size, resampling, rescale, mean and std.
  out.plugin = "image";
  po.emplace_back("patch_size", std::to_string(patch));
  po.emplace_back("cls", "true");
  json pp;
  if (b.tok_file("preprocessor_config.json", "the image processor's size, mean and std").size() &&
      read_json(c, "preprocessor_config.json", &pp)) {
    const std::string pf = c.at("preprocessor_config.json");
    const Json P{&c, &pp, pf};
    if (opt.image_size.empty()) {
      auto sz = pp.find("size");
      int64_t h = img, w = img;
      if (sz != pp.end() && sz->is_object() && sz->contains("height") && sz->contains("width")) {
        const Json S{&c, &*sz, pf + ": size"};
        h = S.i("height", img, 1, bound::kImage);
        w = S.i("width", img, 1, bound::kImage);
      } else if (sz != pp.end() && sz->is_number_integer()) {
        h = w = P.i("size", img, 1, bound::kImage);
      } else if (sz != pp.end()) {
        c.err(pf + ": size " + jsonfile::brief(*sz) +
              " is not implemented (Tessera reads {height, width} or one number)");
      }
      if ((h != img || w != img) && c.bad_values == 0)
        c.err(pf + ": the processor resizes to " + std::to_string(h) + "x" + std::to_string(w) +
                  " but config.json's image_size is " + std::to_string(img),
              "set the image plugin's image_size to choose a size; the position grid follows it");
      po.emplace_back("image_size", std::to_string(h) + "," + std::to_string(w));
    }
    const int64_t resample = P.i("resample", 2, 0, 5);
    if (resample == 2)
      po.emplace_back("resize", "pil_bilinear");
    else if (resample == 3)
      po.emplace_back("resize", "pil_bicubic");
    else
      c.err(pf + ": resample " + std::to_string(resample) + " is not implemented (2 bilinear, 3 bicubic)");
    if (!P.b("do_resize", true)) c.err(pf + ": do_resize false is not implemented");
    po.emplace_back("rescale_factor",
                    P.b("do_rescale", true) ? fmt(P.f("rescale_factor", 1.0 / 255, 0.0, 1e6, true)) : "1");
    // image_mean, image_std: one number or three, each finite (a std also positive: it divides).
    auto three = [&](const char* key, double def, bool positive) {
      auto it = pp.find(key);
      if (it == pp.end() || !P.b("do_normalize", true)) return fmt(def) + "," + fmt(def) + "," + fmt(def);
      const bool list = it->is_array() && it->size() == 3;
      std::string text;
      for (size_t k = 0; k < 3; ++k) {
        const json& v = list ? (*it)[k] : *it;
        const double x = v.is_number() ? v.get<double>() : NAN;
        if ((!list && !it->is_number()) || !std::isfinite(x) || (positive && x <= 0) || std::fabs(x) > 1e6) {
          c.err(pf + ": key \"" + key + "\": expected one or three finite numbers" +
                (positive ? " above 0" : "") + ", found " + jsonfile::brief(list ? v : *it));
          ++c.bad_values;
          return fmt(def) + "," + fmt(def) + "," + fmt(def);
        }
        text += (k ? "," : "") + fmt(x);
      }
      return text;
    };
    po.emplace_back("mean", three("image_mean", P.b("do_normalize", true) ? 0.5 : 0.0, false));
    po.emplace_back("std", three("image_std", 1.0, true));
    if (P.b("do_center_crop", false)) c.err(pf + ": do_center_crop is not implemented for ViT folders");
  }
  if (ch != 3)
    c.err(cfg_path + ": num_channels " + std::to_string(ch) + " (the image plugin gives RGB, 3 channels)");
  return ok;
}

}  // namespace tessera::hf::imp
