// Datasets: a directory, a glob, a manifest (CSV or JSONL), a FASTA file, an IDX image file or a
// text file, listed as items with stable ids. Files are not read here beyond what splitting needs
// (FASTA records, lines, manifest rows), and plugins see the bytes later; IDX files, gzip'd and so
// read whole, are the exception: each image is cut out here, as a small PGM file in memory. A
// broken item is listed with its error, not dropped.
#include <glob.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "tessera/fileio.h"
#include "tessera/idx.h"
#include "tessera/run.h"

namespace tessera {

namespace fs = std::filesystem;

namespace {

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// Where text starts: after a UTF-8 byte-order mark, if there is one.
size_t after_bom(const char* data, size_t n) {
  return n >= 3 && static_cast<unsigned char>(data[0]) == 0xEF && static_cast<unsigned char>(data[1]) == 0xBB &&
                 static_cast<unsigned char>(data[2]) == 0xBF
             ? 3
             : 0;
}

bool has_wildcard(const std::string& p) { return p.find_first_of("*?[") != std::string::npos; }

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

DataFormat detect(const std::string& path) {
  if (has_wildcard(path)) return DataFormat::glob;
  std::error_code ec;
  if (fs::is_directory(path, ec)) return DataFormat::dir;
  const std::string ext = lower(fs::path(path).extension().string());
  const std::string name = lower(fs::path(path).filename().string());
  // MNIST's names: train-images-idx3-ubyte(.gz), and mirrors' train-images.idx3-ubyte
  if (ends_with(name, "idx3-ubyte") || ends_with(name, "idx3-ubyte.gz") || ext == ".idx")
    return DataFormat::idx;
  if (ext == ".csv" || ext == ".jsonl") return DataFormat::manifest;
  if (ext == ".fasta" || ext == ".fa" || ext == ".faa" || ext == ".fas" || ext == ".fna" || ext == ".ffn")
    return DataFormat::fasta;
  return DataFormat::lines;
}

bool wanted(const PluginInput& p, const fs::path& file) {
  if (p.extensions.empty()) return true;
  const std::string ext = lower(file.extension().string());
  return std::find(p.extensions.begin(), p.extensions.end(), ext) != p.extensions.end();
}

// A whole file as the one input of an item.
ItemPart file_part(const PluginInput& p, const std::string& path) {
  ItemPart part;
  part.path = path;
  part.is_text = p.kind == TSR_INPUT_TEXT;
  std::error_code ec;
  part.length = part.is_text ? fs::file_size(path, ec) : 0;
  part.line = part.is_text ? 1 : 0;
  return part;
}

// `dataset` names the kind with its article: "a directory", "an IDX".
Status one_plugin(const std::vector<PluginInput>& plugins, const char* dataset) {
  if (plugins.size() != 1)
    return Status::Invalid(
        std::string(dataset) + " dataset feeds exactly one plugin, but the experiment has " +
        std::to_string(plugins.size()) + " (pair inputs of several plugins in a manifest)");
  return Status::Ok();
}

Result<std::vector<DataItem>> list_files(const std::vector<std::string>& files, const fs::path& base,
                                         const PluginInput& p) {
  std::vector<DataItem> items;
  for (const std::string& f : files) {
    DataItem it;
    it.id = fs::path(f).lexically_relative(base).generic_string();
    it.parts.push_back(file_part(p, f));
    items.push_back(std::move(it));
  }
  return items;
}

Result<std::vector<DataItem>> read_dir(const std::string& dir, const PluginInput& p) {
  std::vector<std::string> files;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, fs::directory_options::skip_permission_denied, ec);
       it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (ec) return Status::IoError(dir + ": cannot list the directory: " + ec.message());
    if (it->is_regular_file(ec) && wanted(p, it->path()) && it->path().filename().string()[0] != '.')
      files.push_back(it->path().string());
  }
  if (ec) return Status::IoError(dir + ": cannot list the directory: " + ec.message());
  std::sort(files.begin(), files.end());
  if (files.empty())
    return Status::NotFound(dir + ": no files for plugin " + p.name + " (it reads " +
                            (p.extensions.empty() ? std::string("any file") : [&] {
                              std::string e;
                              for (const auto& x : p.extensions) e += (e.empty() ? "" : ", ") + x;
                              return e;
                            }()) + ")");
  return list_files(files, dir, p);
}

Result<std::vector<DataItem>> read_glob(const std::string& pattern, const PluginInput& p) {
  glob_t g{};
  const int rc = glob(pattern.c_str(), GLOB_ERR, nullptr, &g);
  std::vector<std::string> files;
  for (size_t i = 0; rc == 0 && i < g.gl_pathc; ++i) {
    std::error_code ec;
    if (fs::is_regular_file(g.gl_pathv[i], ec)) files.push_back(g.gl_pathv[i]);
  }
  globfree(&g);
  if (rc != 0 && rc != GLOB_NOMATCH) return Status::IoError(pattern + ": the glob could not be expanded");
  if (files.empty()) return Status::NotFound(pattern + ": the glob matches no file");
  std::sort(files.begin(), files.end());
  // ids are relative to the pattern's directory part before the first wildcard
  const std::string fixed = pattern.substr(0, pattern.find_first_of("*?["));
  const fs::path base = fixed.back() == '/' ? fs::path(fixed) : fs::path(fixed).parent_path();
  return list_files(files, base, p);
}

Result<std::vector<DataItem>> read_fasta(const std::string& path) {
  Result<std::shared_ptr<MappedFile>> m = MappedFile::open(path);
  if (!m.ok()) return m.status();
  const char* data = reinterpret_cast<const char*>((*m)->data());
  const size_t n = (*m)->size();
  const std::string base = fs::path(path).filename().string();
  std::vector<DataItem> items;
  bool in_record = false, junk_reported = false;
  auto close = [&](size_t end) {
    if (in_record) items.back().parts[0].length = end - items.back().parts[0].offset;
  };
  uint32_t line = 1;
  for (size_t pos = after_bom(data, n); pos < n; ++line) {
    const size_t eol = static_cast<size_t>(std::find(data + pos, data + n, '\n') - data);
    if (data[pos] == '>') {  // a header starts a record, which runs to the next header
      close(pos);
      DataItem it;
      it.id = base + "#" + std::to_string(items.size() + 1 - (junk_reported ? 1 : 0));
      const char* name_end = std::find_if(data + pos + 1, data + eol, [](char c) { return std::isspace(static_cast<unsigned char>(c)); });
      it.name = std::string(data + pos + 1, name_end);
      ItemPart part;
      part.path = path;
      part.is_text = true;
      part.offset = pos;
      part.line = line;
      it.parts.push_back(part);
      items.push_back(std::move(it));
      in_record = true;
    } else if (!in_record && !junk_reported &&
               !std::all_of(data + pos, data + eol, [](char c) { return std::isspace(static_cast<unsigned char>(c)); })) {
      // Text before the first header: one broken item, so the run records it and goes on.
      DataItem it;
      it.id = base + ":" + std::to_string(line);
      it.error = path + ":" + std::to_string(line) + ":1: sequence data before the first '>' header line "
                 "(every FASTA record starts with '>name')";
      items.push_back(std::move(it));
      junk_reported = true;
    }
    pos = eol + 1;
  }
  close(n);
  if (items.empty() || (junk_reported && items.size() == 1))
    return Status::NotFound(path + ": no FASTA records (no line starts with '>')");
  return items;
}

Result<std::vector<DataItem>> read_lines(const std::string& path, const PluginInput& p) {
  Result<std::shared_ptr<MappedFile>> m = MappedFile::open(path);
  if (!m.ok()) return m.status();
  const char* data = reinterpret_cast<const char*>((*m)->data());
  const size_t n = (*m)->size();
  const std::string base = fs::path(path).filename().string();
  std::vector<DataItem> items;
  uint32_t line = 0;
  for (size_t pos = after_bom(data, n); pos < n;) {
    ++line;
    size_t eol = std::find(data + pos, data + n, '\n') - data;
    size_t end = eol;
    if (end > pos && data[end - 1] == '\r') --end;
    if (end > pos) {  // empty lines are not items
      DataItem it;
      it.id = base + ":" + std::to_string(line);
      ItemPart part;
      part.path = path;
      part.is_text = true;
      part.offset = pos;
      part.length = end - pos;
      part.line = line;
      it.parts.push_back(part);
      items.push_back(std::move(it));
    }
    pos = eol + 1;
  }
  (void)p;
  if (items.empty()) return Status::NotFound(path + ": no lines with text");
  return items;
}

// ---- IDX images ----------------------------------------------------------------------------------

// The labels of n images from data.labels: one integer per image, as its name in data.label_names
// or as the number.
Result<std::vector<std::string>> read_idx_labels(const DataConfig& data, int64_t n) {
  TSR_ASSIGN_OR_RETURN(Tensor labels, idx::load(data.labels));
  if (labels.dtype() != DType::u8 || labels.rank() != 1)
    return Status::Invalid(data.labels + ": holds " + labels.describe() +
                           ", but an IDX labels file holds one u8 per image (idx1: magic 00 00 08 01)");
  if (labels.dim(0) != n)
    return Status::Invalid(data.labels + " holds " + std::to_string(labels.dim(0)) + " labels, but " +
                           data.path + " holds " + std::to_string(n) +
                           " images (give the labels file of the same split)");
  const uint8_t* v = labels.data<uint8_t>();
  std::vector<std::string> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    if (data.label_names.empty()) {
      out[static_cast<size_t>(i)] = std::to_string(v[i]);
    } else if (v[i] < data.label_names.size()) {
      out[static_cast<size_t>(i)] = data.label_names[v[i]];
    } else {
      return Status::Invalid(data.labels + ": byte " + std::to_string(8 + i) + " of the IDX data: image " +
                             std::to_string(i) + "'s label " + std::to_string(v[i]) +
                             " has no name (data.label_names names " +
                             std::to_string(data.label_names.size()) + ", for labels 0.." +
                             std::to_string(data.label_names.size() - 1) + ")");
    }
  }
  return out;
}

// Each image of a u8 (count, rows, cols) IDX file is an item, the first `limit` of them (0: all).
// The plugin gets it as a binary PGM file (P5), which the image plugin decodes like any other.
Result<std::vector<DataItem>> read_idx(const DataConfig& data, const PluginInput& p) {
  if (p.kind != TSR_INPUT_FILE)
    return Status::Invalid(data.path + " holds IDX images, but plugin " + p.name +
                           " reads text (use a plugin that reads image files, such as image)");
  TSR_ASSIGN_OR_RETURN(Tensor images, idx::load(data.path));
  if (images.dtype() != DType::u8 || images.rank() != 3)
    return Status::Invalid(
        data.path + ": holds " + images.describe() +
        ", but an IDX image file holds u8 images (count, rows, cols; idx3: magic 00 00 08 03)");
  const int64_t n = images.dim(0), rows = images.dim(1), cols = images.dim(2);
  if (rows == 0 || cols == 0)
    return Status::Invalid(data.path + ": its images are " + std::to_string(rows) + "×" +
                           std::to_string(cols) + " pixels (none)");
  std::vector<std::string> labels;
  if (!data.labels.empty()) {
    TSR_ASSIGN_OR_RETURN(labels, read_idx_labels(data, n));
  }
  const int64_t count = data.limit > 0 ? std::min(n, data.limit) : n;
  const std::string base = fs::path(data.path).filename().string();
  const std::string header = "P5\n" + std::to_string(cols) + " " + std::to_string(rows) + "\n255\n";
  const size_t pixels = static_cast<size_t>(rows * cols);
  const auto* px = images.data<uint8_t>();
  std::vector<DataItem> items(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) {
    DataItem& it = items[static_cast<size_t>(i)];
    it.id = base + "#" + std::to_string(i);
    if (!labels.empty()) it.label = labels[static_cast<size_t>(i)];
    ItemPart part;
    part.path = data.path;
    part.in_memory = true;
    part.bytes.reserve(header.size() + pixels);
    part.bytes.append(header).append(reinterpret_cast<const char*>(px + static_cast<size_t>(i) * pixels),
                                     pixels);
    it.parts.push_back(std::move(part));
  }
  return items;
}

// ---- Manifests ---------------------------------------------------------------------------------

// One CSV record (RFC 4180: quoted fields, "" inside quotes, newlines inside quotes). Returns false
// at the end of the text; sets *error on an unterminated quote.
bool next_csv_record(const std::string& s, size_t* pos, uint32_t* line, std::vector<std::string>* fields,
                     std::string* error) {
  fields->clear();
  if (*pos >= s.size()) return false;
  std::string field;
  bool quoted = false, was_quoted = false;
  const uint32_t start_line = *line;
  size_t col = 1;
  while (*pos < s.size()) {
    const char c = s[(*pos)++];
    ++col;
    if (quoted) {
      if (c == '"') {
        if (*pos < s.size() && s[*pos] == '"') {
          field += '"';
          ++*pos;
        } else {
          quoted = false;
        }
      } else {
        if (c == '\n') ++*line;
        field += c;
      }
    } else if (c == '"' && field.empty() && !was_quoted) {
      quoted = was_quoted = true;
    } else if (c == ',') {
      fields->push_back(field);
      field.clear();
      was_quoted = false;
    } else if (c == '\n') {
      ++*line;
      if (!field.empty() && field.back() == '\r') field.pop_back();
      fields->push_back(field);
      return true;
    } else {
      field += c;
    }
  }
  if (quoted) {
    *error = "line " + std::to_string(start_line) + ": a quoted field is not closed before the end of the file";
    return false;
  }
  if (!field.empty() && field.back() == '\r') field.pop_back();
  fields->push_back(field);
  return true;
}

// Builds an item from a manifest row given as name -> value.
DataItem manifest_item(const std::map<std::string, std::string>& row, const std::vector<PluginInput>& plugins,
                       const fs::path& dir, const std::string& default_id, bool allow_missing) {
  DataItem it;
  auto get = [&](const std::string& k) -> const std::string* {
    auto f = row.find(k);
    return f == row.end() ? nullptr : &f->second;
  };
  it.id = get("id") && !get("id")->empty() ? *get("id") : default_id;
  if (get("label") && !get("label")->empty()) it.label = *get("label");
  for (const PluginInput& p : plugins) {
    ItemPart part;
    const std::string* v = get(p.name);
    bool is_path = p.kind == TSR_INPUT_FILE;
    if (!v && plugins.size() == 1) {
      if ((v = get("path"))) is_path = true;
      else if ((v = get("text"))) is_path = false;
    }
    if ((!v || v->empty()) && allow_missing && plugins.size() > 1) {
      part.missing = true;
      it.parts.push_back(part);
      continue;
    }
    if (!v || v->empty()) {
      it.error = default_id + ": no input for plugin " + p.name + " (give a `" + p.name + "` field" +
                 (plugins.size() == 1 ? (p.name == "text" ? ", or `path`" : p.name == "path" ? ", or `text`" : ", or `path` or `text`")
                                      : "; or set data.allow_missing: true to encode items from the inputs they have") +
                 ")";
      return it;
    }
    if (is_path) {
      const std::string file = (dir / *v).lexically_normal().string();
      std::error_code ec;
      if (!fs::is_regular_file(file, ec)) {
        it.error = default_id + ": " + file + ": no such file";
        return it;
      }
      part = file_part(p, file);
    } else {
      if (p.kind == TSR_INPUT_FILE) {
        it.error = default_id + ": plugin " + p.name + " reads files; give a path, not text";
        return it;
      }
      part.is_text = true;
      part.text = *v;
    }
    it.parts.push_back(part);
  }
  if (std::all_of(it.parts.begin(), it.parts.end(), [](const ItemPart& q) { return q.missing; })) {
    std::string names;
    for (const PluginInput& p : plugins) names += (names.empty() ? "`" : ", `") + p.name + "`";
    it.error = default_id + ": no input for any plugin (give at least one of the fields " + names + ")";
  }
  return it;
}

Result<std::vector<DataItem>> read_manifest(const std::string& path, const std::vector<PluginInput>& plugins,
                                            bool allow_missing) {
  Result<std::string> text = read_file(path);
  if (!text.ok()) return text.status();
  const fs::path dir = fs::path(path).parent_path();
  const std::string base = fs::path(path).filename().string();
  std::vector<DataItem> items;
  if (lower(fs::path(path).extension().string()) == ".jsonl") {
    const std::string& s = *text;
    uint32_t line = 0;
    for (size_t pos = after_bom(s.data(), s.size()); pos < s.size();) {
      ++line;
      const size_t eol = std::min(s.find('\n', pos), s.size());
      const std::string l = s.substr(pos, eol - pos);
      pos = eol + 1;
      if (l.find_first_not_of(" \t\r") == std::string::npos) continue;
      const std::string id = base + ":" + std::to_string(line);
      nlohmann::json j = nlohmann::json::parse(l, nullptr, false);
      if (j.is_discarded() || !j.is_object()) {
        DataItem it;
        it.id = id;
        it.error = path + ":" + std::to_string(line) + ": not a JSON object (each line of a .jsonl manifest is one)";
        items.push_back(std::move(it));
        continue;
      }
      std::map<std::string, std::string> row;
      for (auto& [k, v] : j.items()) row[k] = v.is_string() ? v.get<std::string>() : v.dump();
      items.push_back(manifest_item(row, plugins, dir, id, allow_missing));
    }
  } else {
    size_t pos = after_bom(text->data(), text->size());
    uint32_t line = 1;
    std::vector<std::string> header, fields;
    std::string error;
    if (!next_csv_record(*text, &pos, &line, &header, &error))
      return Status::ParseError(path + ": " + (error.empty() ? "empty manifest (the first line names the columns)" : error));
    for (auto& h : header) h = lower(h);
    for (uint32_t start = line; next_csv_record(*text, &pos, &line, &fields, &error); start = line) {
      if (fields.size() == 1 && fields[0].empty()) continue;  // a blank line
      const std::string id = base + ":" + std::to_string(start);
      if (fields.size() != header.size()) {
        DataItem it;
        it.id = id;
        it.error = path + ":" + std::to_string(start) + ": " + std::to_string(fields.size()) + " fields, but the header names " +
                   std::to_string(header.size()) + " columns";
        items.push_back(std::move(it));
        continue;
      }
      std::map<std::string, std::string> row;
      for (size_t i = 0; i < header.size(); ++i) row[header[i]] = fields[i];
      items.push_back(manifest_item(row, plugins, dir, id, allow_missing));
    }
    if (!error.empty()) return Status::ParseError(path + ": " + error);
  }
  if (items.empty()) return Status::NotFound(path + ": the manifest lists no items");
  for (DataItem& it : items) it.source = path;
  return items;
}

}  // namespace

Result<std::vector<DataItem>> read_dataset(const DataConfig& data, const std::vector<PluginInput>& plugins) {
  if (data.path.empty()) return Status::Invalid("no dataset: set data.path (a directory, glob, manifest, FASTA or text file)");
  if (plugins.empty()) return Status::Invalid("no plugins: list at least one under plugins: to turn items into rows");
  const DataFormat f = data.format == DataFormat::auto_detect ? detect(data.path) : data.format;
  if (!data.labels.empty() && f != DataFormat::idx)
    return Status::Invalid(
        data.path + " is read as " + data_format_name(f) + ", but data.labels (" + data.labels +
        ") belongs to IDX images (name them *-idx3-ubyte(.gz) or *.idx, or set data.format: idx)");
  std::error_code ec;
  if (f != DataFormat::glob && !fs::exists(data.path, ec)) return Status::NotFound(data.path + ": no such file or directory");
  Result<std::vector<DataItem>> items = Status::Internal("unknown data format");
  switch (f) {
    case DataFormat::dir:
      TSR_RETURN_IF_ERROR(one_plugin(plugins, "a directory"));
      items = read_dir(data.path, plugins[0]);
      break;
    case DataFormat::glob:
      TSR_RETURN_IF_ERROR(one_plugin(plugins, "a glob"));
      items = read_glob(data.path, plugins[0]);
      break;
    case DataFormat::manifest: items = read_manifest(data.path, plugins, data.allow_missing); break;
    case DataFormat::fasta:
      TSR_RETURN_IF_ERROR(one_plugin(plugins, "a FASTA"));
      if (plugins[0].kind != TSR_INPUT_TEXT)
        return Status::Invalid("a FASTA dataset needs a plugin that reads text, but " + plugins[0].name + " reads files");
      items = read_fasta(data.path);
      break;
    case DataFormat::lines:
      TSR_RETURN_IF_ERROR(one_plugin(plugins, "a text-lines"));
      if (plugins[0].kind != TSR_INPUT_TEXT)
        return Status::Invalid(data.path + " is read as lines of text, but plugin " + plugins[0].name +
                               " reads files (point data.path at a directory or a manifest instead)");
      items = read_lines(data.path, plugins[0]);
      break;
    case DataFormat::idx:
      TSR_RETURN_IF_ERROR(one_plugin(plugins, "an IDX"));
      items = read_idx(data, plugins[0]);
      break;
    case DataFormat::auto_detect: break;
  }
  if (!items.ok()) return items.status();
  if (data.limit > 0 && static_cast<int64_t>(items->size()) > data.limit) items->resize(static_cast<size_t>(data.limit));
  // Ids must be unique: outputs are keyed by them.
  std::vector<std::string> ids;
  for (const DataItem& it : *items) ids.push_back(it.id);
  std::sort(ids.begin(), ids.end());
  for (size_t i = 1; i < ids.size(); ++i)
    if (ids[i] == ids[i - 1]) return Status::Invalid(data.path + ": item id \"" + ids[i] + "\" appears twice (ids must be unique)");
  return items;
}

}  // namespace tessera
