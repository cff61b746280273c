// The plugin ABI from the host's side: loading, the exact version check and every refusal
// message, search order, option passing, encoding and decoding, and a plugin that fails, throws
// or returns malformed rows — none of which may crash the host.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>

#include "tessera/config.h"
#include "tessera/plugins.h"

using namespace tessera;
namespace fs = std::filesystem;

namespace {

const std::string kDir = TESSERA_TEST_PLUGIN_DIR;  // the test plugins' build folder

std::shared_ptr<const Plugin> load_probe() {
  auto p = Plugin::load(kDir + "/libtessera_probe.so");
  EXPECT_TRUE(p.ok()) << p.status().message();
  return p.ok() ? *p : nullptr;
}

Encoder probe_encoder(const std::string& mode = "normal", const std::string& offset = "0") {
  auto e = Encoder::create(load_probe(), {{"mode", mode}, {"offset", offset}});
  EXPECT_TRUE(e.ok()) << e.status().message();
  return std::move(e).value();
}

PluginItem text_item(const std::string& id, const std::string& text) {
  PluginItem it;
  it.id = id;
  it.data = text;
  return it;
}

}  // namespace

TEST(PluginLoader, LoadsAndDescribesAPlugin) {
  auto p = load_probe();
  ASSERT_TRUE(p);
  EXPECT_EQ(p->name(), "probe");
  EXPECT_EQ(p->modality(), "text");
  EXPECT_EQ(p->version(), "0.1.0");
  EXPECT_EQ(p->input_kind(), TSR_INPUT_TEXT);
  EXPECT_EQ(p->extensions(), std::vector<std::string>{".txt"});
  ASSERT_EQ(p->options().size(), 2u);
  EXPECT_EQ(p->options()[0].name, "mode");
  EXPECT_EQ(p->options()[0].type, TSR_OPT_ENUM);
  EXPECT_EQ(p->options()[0].choices, (std::vector<std::string>{"normal", "refuse"}));
  EXPECT_EQ(p->options()[1].default_value, std::optional<std::string>("0"));
}

TEST(PluginLoader, RefusesAnotherAbiVersionNamingFileAndBothVersions) {
  const std::string file = kDir + "/libtessera_future.so";
  auto p = Plugin::load(file);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), Code::unsupported);
  EXPECT_EQ(p.status().message(), file + ": built for plugin ABI version 999, but this Tessera speaks ABI version 1 "
                                         "(rebuild the plugin against this Tessera's tessera/plugin.h)");
}

TEST(PluginLoader, RefusesLibrariesThatAreNotPlugins) {
  const std::string not_plugin = kDir + "/libtessera_notaplugin.so";
  auto p = Plugin::load(not_plugin);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().message(), not_plugin + ": not a Tessera plugin: it does not export tessera_plugin_entry");
  auto missing = Plugin::load(kDir + "/libtessera_nothing.so");
  EXPECT_EQ(missing.status().message(), kDir + "/libtessera_nothing.so: no such plugin file");
  // A file that is not a shared library at all.
  const std::string junk = ::testing::TempDir() + "libtessera_junk.so";
  { FILE* f = std::fopen(junk.c_str(), "w"); std::fputs("not an ELF file", f); std::fclose(f); }
  auto j = Plugin::load(junk);
  ASSERT_FALSE(j.ok());
  EXPECT_EQ(j.status().message().rfind(junk + ": cannot load: ", 0), 0u) << j.status().message();
  // A plugin whose file name does not match the name it gives.
  const std::string renamed = ::testing::TempDir() + "libtessera_other.so";
  fs::copy_file(kDir + "/libtessera_probe.so", renamed, fs::copy_options::overwrite_existing);
  auto r = Plugin::load(renamed);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(),
            renamed + ": the plugin calls itself \"probe\", so its file must be named libtessera_probe.so");
  fs::remove(junk);
  fs::remove(renamed);
}

TEST(PluginLoader, ScanListsFoundAndRefused) {
  const PluginScan scan = scan_plugins({kDir});
  bool probe = false;
  for (const auto& f : scan.found) probe = probe || (f.name == "probe" && f.version == "0.1.0" && f.modality == "text");
  EXPECT_TRUE(probe);
  int refused = 0;
  for (const auto& r : scan.refused) {
    if (r.file.find("libtessera_future.so") != std::string::npos) {
      EXPECT_NE(r.reason.find("ABI version 999"), std::string::npos);
      ++refused;
    }
    if (r.file.find("libtessera_notaplugin.so") != std::string::npos) ++refused;
  }
  EXPECT_EQ(refused, 2);
}

TEST(PluginLoader, SearchOrderGivenDirsThenEnvironment) {
  const std::string other = ::testing::TempDir() + "tessera_plugin_dir";
  fs::create_directories(other);
  fs::copy_file(kDir + "/libtessera_probe.so", other + "/libtessera_probe.so", fs::copy_options::overwrite_existing);
  setenv("TESSERA_PLUGIN_PATH", (kDir + ":/nonexistent").c_str(), 1);
  auto f = find_plugin("probe", {other});  // a directory given in the YAML comes first
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(fs::path(*f).parent_path(), fs::path(other));
  auto e = find_plugin("probe", {});       // then TESSERA_PLUGIN_PATH
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(fs::path(*e).parent_path(), fs::path(kDir));
  auto none = find_plugin("nosuch", {other});
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("no plugin named \"nosuch\": libtessera_nosuch.so is in none of " + other +
                                         ", " + kDir + ", /nonexistent"),
            std::string::npos) << none.status().message();
  unsetenv("TESSERA_PLUGIN_PATH");
  fs::remove_all(other);
}

TEST(PluginEncoder, EncodesWithOptionsAndDecodes) {
  const Encoder e = probe_encoder("normal", "2");
  EXPECT_EQ(e.info().rows_kind, TSR_ROWS_IDS);
  EXPECT_EQ(e.info().vocab_size, 259);
  EXPECT_EQ(e.info().causal, 1);
  auto rows = e.encode(text_item("a", "Hi!"));
  ASSERT_TRUE(rows.ok()) << rows.status().message();
  ASSERT_EQ(rows->size(), 1u);
  const TokenRows& r = (*rows)[0];
  EXPECT_EQ(r.ids, (std::vector<int32_t>{'H' + 3, 'i' + 3, '!' + 3}));
  EXPECT_EQ(r.positions[2], (std::array<int32_t, 2>{2, -1}));
  EXPECT_EQ(r.provenance[1].kind, TSR_PROV_BYTES);
  EXPECT_EQ(r.provenance[1].x0, 1.0);
  EXPECT_EQ(r.provenance[1].x1, 2.0);
  // Decoding grows its buffer when the text is longer than the first guess.
  const std::string long_text(1000, 'x');
  auto long_rows = e.encode(text_item("b", long_text));
  ASSERT_TRUE(long_rows.ok());
  auto text = e.decode((*long_rows)[0].ids);
  ASSERT_TRUE(text.ok()) << text.status().message();
  EXPECT_EQ(*text, long_text);
  auto two = e.encode(text_item("c", "TWICE"));
  ASSERT_TRUE(two.ok());
  ASSERT_EQ(two->size(), 2u);
  EXPECT_EQ((*two)[1].label, "w1");
}

TEST(PluginEncoder, CreateFailureNamesThePluginAndTheOption) {
  auto e = Encoder::create(load_probe(), {{"mode", "refuse"}, {"offset", "0"}});
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), Code::invalid_argument);
  EXPECT_EQ(e.status().message(), "plugin probe (" + kDir + "/libtessera_probe.so): option mode: mode refuse: "
                                  "refusing as asked");
  auto missing = Encoder::create(load_probe(), {{"mode", "normal"}});
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("option offset: option \"offset\" was not passed"), std::string::npos)
      << missing.status().message();
}

TEST(PluginEncoder, FailuresInsideThePluginComeBackAsStatuses) {
  const Encoder e = probe_encoder();
  auto bad = e.encode(text_item("lines.txt:3", "this will FAIL here"));
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), Code::parse_error);  // TSR_BAD_INPUT
  EXPECT_EQ(bad.status().message(), "lines.txt:3: the text says FAIL at byte 10");
  auto thrown = e.encode(text_item("t", "THROW"));
  ASSERT_FALSE(thrown.ok());
  EXPECT_EQ(thrown.status().code(), Code::internal);
  EXPECT_EQ(thrown.status().message(), "internal error: thrown from inside the plugin");
  auto malformed = e.encode(text_item("m", "MALFORMED"));
  ASSERT_FALSE(malformed.ok());
  EXPECT_NE(malformed.status().message().find("returned malformed rows: id 100000 at row 0 is outside [0, 257) (a bug "
                                              "in the plugin)"),
            std::string::npos) << malformed.status().message();
  // The encoder still works after each failure.
  EXPECT_TRUE(e.encode(text_item("ok", "fine")).ok());
}

TEST(PluginEncoder, KeepsTheLibraryLoadedWhileInUse) {
  Encoder e = probe_encoder();  // the Plugin handle returned by load() is already gone here
  auto rows = e.encode(text_item("x", "still loaded"));
  EXPECT_TRUE(rows.ok());
}

// ---------------------------------------------------------------------------------------------
// Plugin options in experiment files: checked against the plugin's own declarations.

namespace {

std::optional<Experiment> load_text(const std::string& yaml, Diagnostics* d) {
  return load_experiment_from_string(yaml, "p.yaml", kDir, {}, d);
}
const std::string kModel = "model:\n  d_model: 8\n  stem: {kind: tokens, vocab_size: 300}\n";

}  // namespace

TEST(PluginConfig, OptionsAreValidatedAndCompletedWithDefaults) {
  Diagnostics d;
  auto e = load_text(kModel + "plugins:\n  - name: probe\n    path: .\n    options: {offset: 3}\n", &d);
  ASSERT_TRUE(e) << d.str();
  ASSERT_EQ(e->plugins.size(), 1u);
  const PluginConfig& p = e->plugins[0];
  EXPECT_EQ(p.name, "probe");
  EXPECT_EQ(p.file, kDir + "/libtessera_probe.so");
  EXPECT_EQ(p.options, (std::vector<std::pair<std::string, std::string>>{{"mode", "normal"}, {"offset", "3"}}));
  EXPECT_EQ(p.option_where.at("offset").line, 7);
  // The resolved experiment prints the plugin with every option and loads again to the same.
  const std::string yaml = to_yaml(*e);
  EXPECT_NE(yaml.find("plugins:\n  - name: \"probe\"\n    path: \"" + p.file + "\"\n    options:\n      mode: \"normal\"\n"
                      "      offset: 3\n"),
            std::string::npos) << yaml;
  auto again = load_text(yaml, &d);
  ASSERT_TRUE(again) << d.str();
  EXPECT_EQ(again->plugins[0].options, p.options);
  // The options drive a real encoder.
  auto enc = Encoder::create(load_probe(), p.options);
  ASSERT_TRUE(enc.ok()) << enc.status().message();
  EXPECT_EQ(enc->info().vocab_size, 260);
}

TEST(PluginConfig, EveryProblemHasItsPlace) {
  Diagnostics d;
  EXPECT_FALSE(load_text(kModel + "plugins:\n  - name: probe\n    path: .\n    options:\n      ofset: 3\n"
                                  "      mode: refuze\n  - name: nosuch\n  - path: .\n  - {name: probe, path: ., colour: red}\n",
                         &d));
  const std::string s = d.str();
  EXPECT_NE(s.find("p.yaml:8:7: plugins[0].options.ofset: unknown option of plugin probe (did you mean `offset`?)"),
            std::string::npos) << s;
  EXPECT_NE(s.find("p.yaml:9:13: plugins[0].options.mode: \"refuze\" is not one of normal, refuse (did you mean "
                   "`refuse`?)"),
            std::string::npos) << s;
  EXPECT_NE(s.find("p.yaml:10:11: plugins[1].name: no plugin named \"nosuch\""), std::string::npos) << s;
  EXPECT_NE(s.find("p.yaml:11:5: plugins[2]: missing key `name`"), std::string::npos) << s;
  EXPECT_NE(s.find("plugins[3].colour: unknown key"), std::string::npos) << s;
  Diagnostics d2;
  EXPECT_FALSE(load_text(kModel + "plugins:\n  - name: future\n    path: libtessera_future.so\n", &d2));
  EXPECT_NE(d2.str().find("p.yaml:6:11: plugins[0].path: " + kDir +
                          "/libtessera_future.so: built for plugin ABI version 999, but this Tessera speaks ABI "
                          "version 1"),
            std::string::npos) << d2.str();
  Diagnostics d3;
  EXPECT_FALSE(load_text(kModel + "plugins:\n  - {name: probe, path: ., options: {offset: 1.5}}\n", &d3));
  EXPECT_NE(d3.str().find("plugins[0].options.offset: expected int, found 1.5"), std::string::npos) << d3.str();
}
