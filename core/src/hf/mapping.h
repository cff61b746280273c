// The one table between Tessera's parameters and a Hugging Face checkpoint's tensors, shared by
// the importer (hf::import_folder) and the exporter (hf::export_folder): per family, which tensor
// each parameter is and how its layout differs (transposed, a third of a fused Q/K/V, a Conv2d
// kernel, a (1, N, C) embedding), and per class, the prefix and head it has. Private to core/src/hf.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "tessera/config.h"
#include "tessera/tensor.h"

namespace tessera::hf {

enum class Op {
  same,      // the tensor as stored (tables; GPT-2's Conv1D (in, out) weights)
  linear,    // nn.Linear (out, in) <-> (in, out)
  split,     // part `part` of `parts` equal column blocks of a fused (in, parts·out) matrix or bias
  patch,     // Conv2d (C, ch, p, p) <-> (ch·p·p, C): the plugins' patch rows, flattened alike
  squeeze,   // (1, 1, C) or (1, N, C) <-> (C) or (N, C)
  pos_grid,  // ViT positions (1, 1 + g·g, C); the importer may resize the grid
  zeros,     // not in the checkpoint (a bias the class does not have): zeros
};

struct Entry {
  std::string hf;
  Op op = Op::same;
  int part = 0, parts = 1;
  Shape hf_shape;   // patch, squeeze, pos_grid: the shape Hugging Face stores
  std::string why;  // zeros: why the checkpoint has no such tensor
};

// What the mapping needs beyond the ModelConfig: how this checkpoint names and shapes things.
struct Layout {
  std::string prefix;     // the base model's prefix in this class ("bert.", "vit.", or "")
  bool qkv_bias = true;   // vit, ast: config.json's qkv_bias
  int64_t channels = 3;   // vit: num_channels
  int64_t grid = 0;       // vit: side of the checkpoint's square position grid
};

struct TensorMap {
  std::map<std::string, Entry> entries;  // Tessera parameter -> its tensor; a superset of
                                         // parameter_specs (entries the config lacks are unused)
  std::string tied_decoder;  // lm, tied: the decoder tensor transformers ties to the token table
};

// Family "bert", "gpt2", "vit", "esm" or "ast". Reads m's layers, stem, positions and head.
TensorMap tensor_map(const std::string& family, const ModelConfig& m, const Layout& layout);

// The tensor's shape in the checkpoint for a parameter of shape s.
Shape expected_hf_shape(const Entry& e, const Shape& s);

// A class of a family: which Tessera head it carries and the prefix of its base model.
struct HfClass {
  const char* family;
  const char* name;    // architectures[0]
  const char* prefix;  // before the base model's tensor names
  HeadKind head;       // pool covers none too (the base model)
};
const std::vector<HfClass>& hf_classes();
// The prefix that `family`'s task classes put before the base model ("bert.", "transformer.", ...).
std::string task_prefix(const std::string& family);

// ESM-2's 33 tokens in id order: the vocab.txt of every esm2_* checkpoint, and the protein
// plugin's alphabet (plugins/protein/esm_alphabet.h).
const std::vector<std::string>& esm2_alphabet();

}  // namespace tessera::hf
