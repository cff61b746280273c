// Hugging Face model folders: config.json, the safetensors weights (one file, or shards with
// their index) and the tokenizer or preprocessor files beside them, read into a ModelConfig whose
// weights are the checkpoint's own tensors under Tessera's parameter names.
//
//   Diagnostics diags;
//   std::optional<hf::Folder> f = hf::import_folder("/models/all-MiniLM-L6-v2", {}, {}, &diags);
//   if (!f) { fputs(diags.str().c_str(), stderr); return 2; }  // every problem at once
//   Result<Model> model = Model::build(f->model);
//
// In YAML this is `model: {from: hf, path: DIR}`; the loader calls import_folder and fills the
// options of the experiment's plugin (vocabulary, image size, mean and std, mel settings) from the
// folder, unless the YAML sets them.
//
// Families (config.json's model_type):
//   bert  BERT, MiniLM, sentence-transformers: post-LN, token types, embedding layer norm; the
//         pooling of sentence-transformers' modules.json (mean + L2 normalisation for MiniLM),
//         else the CLS pooler (dense + tanh); BertForMaskedLM and BertForSequenceClassification.
//   gpt2  pre-LN decoder; Conv1D weights are already (in, out); c_attn split into Q, K, V; tanh GELU;
//         LM head tied to the token table, or lm_head.weight (its bias zeros) when
//         tie_word_embeddings is false.
//   vit   patch Conv2d as the linear stem over the image plugin's patches, CLS row, learned
//         positions (bicubically resized, as transformers 4.40 does, for another image size),
//         classifier on the CLS row.
//   esm   ESM-2: rotary positions, token-dropout rescaling, emb_layer_norm_after, masked-LM head
//         (dense, GELU, layer norm, decoder with bias; BERT's too: the token table unless
//         tie_word_embeddings is false).
//   ast   Audio Spectrogram Transformer: Kaldi fbank 16x16 patches (stride 10) as the linear stem,
//         CLS and distillation rows, learned positions, classifier on their mean after a layer norm.
// Weights may be F32, F16 or BF16. F32 tensors are zero-copy views of the memory-mapped files
// (transposed views where Hugging Face stores (out, in)); F16 and BF16 are widened to f32 once.
//
// Problems are reported as Diagnostics at `where` (key "model.path"), each naming the file: a
// missing or malformed config.json (with line and column), an unknown model_type (naming the known
// families), settings Tessera does not implement, missing tokenizer or preprocessor files, and
// every missing, unexpected or mis-shaped tensor with its expected and found shapes — all of them
// in one pass (the first 24 of each kind, then a count). Every JSON file of the folder is read
// within limits checked before it is read or parsed (64 MiB, 64 levels of nesting, 512 MiB of
// parsed tree), and every key through a typed, ranged accessor: a wrong type or a size out of its
// documented range (docs/MODELS.md, "Limits") is named once with the file, key, expected and found
// value, and stops the import before the tensors are checked.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tessera/config.h"
#include "tessera/parameters.h"

namespace tessera::hf {

struct ImportOptions {
  // vit: the image size the plugin will cut patches from ({height, width}); empty: config.json's.
  // Another size resizes the learned position grid.
  std::vector<int64_t> image_size;
};

struct Folder {
  std::string family;    // bert, gpt2, vit, esm, ast
  std::string hf_class;  // config.json's architectures[0], e.g. "BertModel"
  ModelConfig model;     // resolved, with weights.imported holding every parameter
  std::string plugin;    // the modality plugin that feeds it: text, image, audio or protein
  // That plugin's options as the folder implies them, as canonical text (see PluginConfig).
  std::vector<std::pair<std::string, std::string>> plugin_options;
  std::vector<std::string> notes;  // what was read and what was left out, for `tessera check`
};

std::optional<Folder> import_folder(const std::string& dir, const ImportOptions& options, const Location& where,
                                    Diagnostics* diags);

// ---------------------------------------------------------------------------------------------
// Export (`tessera export EXP.yaml --hf DIR`): the inverse of import_folder.
//
//   Diagnostics diags;
//   hf::ExportReport rep;
//   if (!hf::export_folder(exp, params, "out/my-bert", &diags, &rep)) fputs(diags.str().c_str(), stderr);
//
// Writes exp.model with `params` (the parameters it asks for, e.g. Parameters::resolve or a
// training run's best.safetensors) as a Hugging Face folder that transformers loads: config.json,
// model.safetensors (F32, the class's tensor names and layouts, the table import_folder reads) and
// the family's tokenizer or preprocessor files. The family is the one the model came from
// (model.from: hf), else the one its architecture matches: a decoder is gpt2; an encoder with a
// features stem is ast with a distillation row, else vit; one with a tokens stem is esm with rotary
// positions, else bert. The class follows the head: bert BertModel (pool, none; sentence-transformers'
// modules.json for mean or last pooling and L2 normalisation), BertForSequenceClassification,
// BertForMaskedLM; gpt2 GPT2LMHeadModel; vit ViTModel, ViTForImageClassification; esm EsmModel (mean
// pool), EsmForMaskedLM; ast ASTModel, ASTForAudioClassification. Tokenizer files: those of the
// source folder (model.from: hf), else what the experiment's plugin maps to (a WordPiece vocab.txt for
// bert, BPE vocab.json and merges.txt for gpt2, ESM-2's alphabet, the image or audio plugin's
// settings as preprocessor_config.json); a tokenizer that has no Hugging Face equivalent is noted.
//
// Every setting the family cannot represent (pre-LN in a BERT, mean pooling in a ViT, sinusoidal
// positions, a nonzero bias the class lacks, ...) is reported at its config key (exp.where) before
// anything is written; then false. The folder is assembled in a scratch folder beside `dir` and
// renamed into place, so a failed export leaves nothing; `dir` must not exist (or be empty).
struct ExportReport {
  std::string family;               // bert, gpt2, vit, esm, ast
  std::string hf_class;             // architectures[0]
  size_t tensors = 0;               // in model.safetensors
  std::vector<std::string> files;   // written, relative to the folder
  std::vector<std::string> notes;   // what could not be written (a tokenizer without an equivalent)
};

bool export_folder(const Experiment& exp, const Parameters& params, const std::string& dir, Diagnostics* diags,
                   ExportReport* report);

// The family export_folder writes `m` as (before checking that it fits).
std::string export_family(const ModelConfig& m);

// "bert, gpt2, vit, esm, ast"
const std::vector<std::string>& known_families();

// Resizes a (gh·gw, C) grid of position rows to (oh·ow, C) as torch.nn.functional.interpolate
// (mode bicubic, align_corners false, A = -0.75, edges clamped) does with the given scale factors
// (output = floor(input · scale); source = (dest + 0.5) / scale - 0.5).
Tensor resize_position_grid(const Tensor& grid, int64_t gh, int64_t gw, double scale_h, double scale_w);

}  // namespace tessera::hf
