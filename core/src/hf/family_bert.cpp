// BERT, MiniLM and sentence-transformers folders: post-LN encoder, token types, embedding layer
// norm; the head from the class's tensors or sentence-transformers' modules.json; WordPiece text.
#include "import.h"

namespace tessera::hf::imp {

bool read_bert(Build& b) {
  Ctx& c = b.c;
  const json& cfg = b.cfg;
  const Json& J = b.J;
  const std::string& cfg_path = b.cfg_path;
  Folder& out = b.out;
  ModelConfig& m = b.m;
  std::set<std::string>& ignorable = b.ignorable;
  std::vector<std::string>& ignorable_prefixes = b.ignorable_prefixes;
  auto& po = b.out.plugin_options;
  bool ok = b.common(NormPlacement::post, "layer_norm_eps", 1e-12);
  const std::string p = b.base_prefix("embeddings.word_embeddings.weight");
  if (J.s("position_embedding_type", "absolute") != "absolute")
    c.err(cfg_path + ": position_embedding_type \"" + J.s("position_embedding_type", "") +
          "\" is not implemented (Tessera's BERT has absolute positions)");
  if (J.b("is_decoder", false) || J.b("add_cross_attention", false))
    c.err(cfg_path + ": a BERT decoder (is_decoder, add_cross_attention) is not implemented");
  ok = activation_of(c, cfg_path, "hidden_act", J.s("hidden_act", "gelu"), &m.activation) && ok;
  m.d_ff = J.i("intermediate_size", std::nullopt, 1, bound::kFf);
  m.positions.kind = PositionKind::learned;
  m.positions.max_len = J.i("max_position_embeddings", 512, 1, bound::kPositions);
  m.stem.kind = StemKind::tokens;
  m.stem.vocab_size = J.i("vocab_size", std::nullopt, 1, bound::kVocab);
  m.stem.token_types = J.i("type_vocab_size", 2, 1, bound::kTypes);
  m.stem.norm = true;
  // decoder.bias is cls.predictions.bias (one shared tensor), saved under either name or both.
  ignorable = {p + "embeddings.position_ids", "cls.predictions.decoder.bias"};
  // The head: a classifier, a masked-LM head, sentence-transformers' pooling, or the CLS pooler.
  const bool pooler = b.has_tensor(p + "pooler.dense.weight");
  if (b.has_tensor("classifier.weight")) {
    m.head.kind = HeadKind::classifier;
    m.head.n_classes = num_labels(cfg, J);
    m.head.labels = labels_of(cfg, m.head.n_classes);
    m.head.pool = PoolKind::cls;
    m.head.pooler = true;
  } else if (b.has_tensor("cls.predictions.bias")) {
    m.head.transform = true;
    b.lm_head(true);
  } else {
    m.head.kind = HeadKind::pool;
    m.head.pool = PoolKind::cls;
    m.head.pooler = pooler;
    if (c.has("modules.json")) {
      // modules.json is a list of sentence-transformers modules.
      json list;
      bool pooling = false;
      const std::string mpath = c.at("modules.json");
      if (read_json(c, "modules.json", &list, /*object=*/false) && !list.is_array())
        c.err(mpath + ": expected a JSON array of modules ({\"type\": ..., \"path\": ...}), found " +
              jsonfile::brief(list));
      for (const json& mod : list.is_array() ? list : json::array()) {
        if (!mod.is_object()) {
          c.err(mpath + ": expected each module to be an object with \"type\" and \"path\", found " +
                jsonfile::brief(mod));
          break;
        }
        const Json M{&c, &mod, mpath};
        const std::string t = M.s("type", "");
        const std::string path = M.s("path", "");
        if (ends_with(t, "models.Normalize")) m.head.normalize = true;
        if (ends_with(t, "models.Pooling")) {
          const std::string pcfg = path + "/config.json";
          if (path.empty() || path[0] == '/' || path.find("..") != std::string::npos || !c.has(pcfg)) {
            c.err(c.at(pcfg) + ": missing or not valid JSON (sentence-transformers' pooling)",
                  "modules.json's \"path\" names a folder inside the model folder, such as 1_Pooling");
            continue;
          }
          json pc;
          if (!read_json(c, pcfg, &pc)) continue;
          const Json P{&c, &pc, c.at(pcfg)};
          pooling = true;
          m.head.pooler = false;
          if (P.b("pooling_mode_mean_tokens", false))
            m.head.pool = PoolKind::mean;
          else if (P.b("pooling_mode_cls_token", false))
            m.head.pool = PoolKind::cls;
          else if (P.b("pooling_mode_lasttoken", false))
            m.head.pool = PoolKind::last;
          else
            c.err(c.at(pcfg) + ": only mean, cls and lasttoken pooling are implemented");
          if (P.b("pooling_mode_max_tokens", false) || P.b("pooling_mode_mean_sqrt_len_tokens", false) ||
              P.b("pooling_mode_weightedmean_tokens", false))
            c.err(c.at(pcfg) + ": max, sqrt-length and weighted-mean pooling are not implemented");
        }
      }
      if (pooling)
        out.notes.push_back(
            "pooling from sentence-transformers' modules.json: " + std::string(pool_kind_name(m.head.pool)) +
            (m.head.normalize ? ", L2-normalised" : ""));
    }
    if (!m.head.pooler && pooler) {
      ignorable.insert(p + "pooler.dense.weight");
      ignorable.insert(p + "pooler.dense.bias");
      out.notes.push_back("the checkpoint's CLS pooler (pooler.dense) is not used");
    }
  }
  ignorable_prefixes.push_back("cls.seq_relationship.");
  // The text plugin: WordPiece over vocab.txt, cased or not as the tokenizer says.
  out.plugin = "text";
  const std::string vocab = b.tok_file("vocab.txt", "the WordPiece vocabulary the text plugin reads");
  json tc;
  const bool have_tc = c.has("tokenizer_config.json") && read_json(c, "tokenizer_config.json", &tc);
  po.emplace_back("tokenizer", "wordpiece");
  if (!vocab.empty()) po.emplace_back("vocab", vocab);
  const Json T{&c, &tc, c.at("tokenizer_config.json")};
  if (have_tc && T.find("do_lower_case"))
    po.emplace_back("lowercase", T.b("do_lower_case", true) ? "true" : "false");
  if (have_tc && T.find("strip_accents") && T.find("strip_accents")->is_boolean())
    po.emplace_back("strip_accents", T.b("strip_accents", false) ? "true" : "false");
  int64_t max_len = m.positions.max_len;
  // transformers writes a huge float (1e30) for "no limit": only a positive integer that fits limits it.
  if (const json* v = have_tc ? T.find("model_max_length") : nullptr; v && v->is_number_integer()) {
    const bool fits = v->is_number_unsigned() ? v->get<uint64_t>() - 1 < static_cast<uint64_t>(INT64_MAX)
                                              : v->get<int64_t>() > 0;
    if (fits) max_len = std::min<int64_t>(max_len, v->get<int64_t>());
  }
  json sb;
  if (c.has("sentence_bert_config.json") && read_json(c, "sentence_bert_config.json", &sb)) {
    const Json S{&c, &sb, c.at("sentence_bert_config.json")};
    if (S.find("max_seq_length"))
      max_len = std::min<int64_t>(max_len, S.i("max_seq_length", max_len, 1, bound::kPositions));
    if (S.b("do_lower_case", false)) po.emplace_back("lowercase", "true");
    po.emplace_back("length_policy", "truncate");  // sentence-transformers truncates
  }
  po.emplace_back("max_length", std::to_string(max_len));
  return ok;
}

}  // namespace tessera::hf::imp
