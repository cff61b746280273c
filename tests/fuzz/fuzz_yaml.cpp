// Fuzzes the experiment loader (load_experiment) on files: the input is up to three parts joined by
// NUL bytes: the experiment (exp.yaml), a second file it may include (inc.yaml, as
// `model: {include: inc.yaml}`), and `--set` overrides, one per line. Whatever the input, the loader
// returns an experiment or nullopt with at least one diagnostic, each of which prints.
#include <cstdlib>

#include "fuzz_util.h"
#include "tessera/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto parts = fuzz::split(std::string_view(reinterpret_cast<const char*>(data), size), 3);
  const std::string dir = fuzz::scratch();
  fuzz::write(dir + "/exp.yaml", parts[0]);
  if (parts.size() > 1) fuzz::write(dir + "/inc.yaml", parts[1]);
  else std::filesystem::remove(dir + "/inc.yaml");
  tessera::LoadOptions opt;
  if (parts.size() > 2) {
    std::string_view sets = parts[2];
    while (!sets.empty() && opt.overrides.size() < 8) {
      const size_t eol = std::min(sets.find('\n'), sets.size());
      opt.overrides.emplace_back(sets.substr(0, eol));
      sets.remove_prefix(std::min(eol + 1, sets.size()));
    }
  }
  tessera::Diagnostics diags;
  std::optional<tessera::Experiment> exp = tessera::load_experiment(dir + "/exp.yaml", opt, &diags);
  if (!exp && diags.empty()) {
    fprintf(stderr, "load_experiment failed without a diagnostic\n");
    std::abort();
  }
  const std::string text = diags.str();
  fuzz::touch(text.data(), text.size());
  if (exp) {
    const std::string resolved = tessera::to_yaml(*exp);
    fuzz::touch(resolved.data(), resolved.size());
  }
  return 0;
}
