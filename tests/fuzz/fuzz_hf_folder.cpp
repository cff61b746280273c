// Fuzzes Hugging Face model folders (hf::import_folder): the JSON files of a folder come from the
// input, the weights and the other files from one of the committed test folders
// (tests/data/hf/<family>/model, picked by the first byte). The rest of the input is up to seven
// parts joined by NUL bytes, one per JSON file below in order; a file with no part is the
// committed one (a link), so a seed can be one config.json alone.
#include <cstdlib>

#include "fuzz_util.h"
#include "tessera/hf.h"

namespace fs = std::filesystem;

namespace {
const char* const kFamilies[] = {"bert", "bert_cls", "bert_mlm", "bert_mlm_untied", "esm",
                                 "esm_untied", "gpt2", "gpt2_untied", "vit", "vit_pooler", "ast"};
const char* const kJson[] = {"config.json", "tokenizer_config.json", "special_tokens_map.json",
                             "preprocessor_config.json", "model.safetensors.index.json", "modules.json",
                             "1_Pooling/config.json"};
constexpr size_t kNumJson = sizeof kJson / sizeof kJson[0];
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const fs::path src = fs::path(TESSERA_FUZZ_DATA_DIR) / "hf" / kFamilies[data[0] % std::size(kFamilies)] / "model";
  const fs::path dir = fs::path(fuzz::scratch()) / "model";
  std::error_code ec;
  fs::remove_all(dir, ec);
  fs::create_directories(dir / "1_Pooling");
  // The committed folder as links, then the input's JSON files over them.
  for (const auto& e : fs::recursive_directory_iterator(src)) {
    if (!e.is_regular_file()) continue;
    const fs::path to = dir / fs::relative(e.path(), src);
    fs::create_directories(to.parent_path());
    fs::create_symlink(e.path(), to, ec);
  }
  const auto parts = fuzz::split(std::string_view(reinterpret_cast<const char*>(data + 1), size - 1), kNumJson);
  for (size_t i = 0; i < parts.size(); ++i) {
    fs::remove(dir / kJson[i], ec);
    fuzz::write((dir / kJson[i]).string(), parts[i]);
  }
  tessera::Diagnostics diags;
  auto folder = tessera::hf::import_folder(dir.string(), {}, {}, &diags);
  if (!folder && diags.empty()) {
    fprintf(stderr, "import_folder failed without a diagnostic\n");
    std::abort();
  }
  const std::string text = diags.str();
  fuzz::touch(text.data(), text.size());
  return 0;
}
