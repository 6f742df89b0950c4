// Strict YAML loading, --set overrides, the resolved-config dump and the key reference, all driven
// by the schema table (config_schema.cpp). Every error is one line: "config <file>: <key>: <fix>".
#include "config/config_loader.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "config/config_dependent_keys.h"
#include "config/config_schema.h"
#include "core/check.h"

namespace mt {

namespace {

// Text safe to put in a one-line message: control characters escaped, long text cut.
std::string one_line(const std::string& s, std::size_t max_len = 80) {
  std::string out;
  for (unsigned char c : s) {
    if (c == '\n') out += "\\n";
    else if (c == '\t') out += "\\t";
    else if (c < 0x20 || c == 0x7f) out += '?';
    else out += static_cast<char>(c);
    if (out.size() > max_len) return out.substr(0, max_len) + "...";
  }
  return out;
}

std::string trim(const std::string& s) {
  std::size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return s.substr(b, e - b);
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

int line_of(const YAML::Node& n) {
  const YAML::Mark m = n.Mark();
  return m.line >= 0 ? m.line + 1 : -1;
}

std::string line_suffix(int line) { return line >= 0 ? str_cat(" (line ", line, ")") : std::string(); }

[[noreturn]] void fail(const std::string& origin, const std::string& msg, int line = -1) {
  detail::throw_error(config_error_prefix(origin) + msg + line_suffix(line));
}

std::string describe(const YAML::Node& n) {
  if (!n.IsDefined() || n.IsNull()) return "nothing (null)";
  if (n.IsSequence()) return "a list";
  if (n.IsMap()) return "a mapping";
  return "'" + one_line(n.Scalar()) + "'";
}

// ---------------------------------------------------------------- scalar parsing

template <class T>
bool parse_integer(std::string text, T& out) {
  text = trim(text);
  if (!text.empty() && text[0] == '+') text.erase(0, 1);
  if (text.empty()) return false;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, out);
  return ec == std::errc() && ptr == end;
}

bool parse_number(std::string text, double& out) {
  text = trim(text);
  if (!text.empty() && text[0] == '+') text.erase(0, 1);
  if (text.empty()) return false;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, out);
  return ec == std::errc() && ptr == end && std::isfinite(out);
}

bool is_number_node(const YAML::Node& n) {
  double d;
  return n.IsScalar() && parse_number(n.Scalar(), d);
}

// ---------------------------------------------------------------- one value into its field

void assign(const ConfigField& f, const YAML::Node& node, Config& cfg, const std::string& origin, int line) {
  auto expected = [&](const YAML::Node& got, const std::string& what = "") {
    fail(origin, str_cat(f.path, ": expected ", what.empty() ? field_type_expectation(f) : what, ", got ", describe(got)),
         line);
  };
  if (f.optional && node.IsNull()) {  // null: unset, the model.arch preset fills it
    f.reset(cfg);
    return;
  }
  const bool scalar = node.IsScalar();
  const std::string text = scalar ? node.Scalar() : std::string();
  FieldPtr p = f.at(cfg);
  switch (f.type) {
    case FieldType::Int: {
      long long v = 0;
      if (!scalar || !parse_integer(text, v)) expected(node);
      MT_CHECK(v >= std::numeric_limits<int>::min() && v <= std::numeric_limits<int>::max(), config_error_prefix(origin),
               f.path, " = ", v, ": does not fit in a 32-bit integer", line_suffix(line));
      *std::get<int*>(p) = static_cast<int>(v);
      break;
    }
    case FieldType::Int64: {
      int64_t v = 0;
      if (!scalar || !parse_integer(text, v)) expected(node);
      *std::get<int64_t*>(p) = v;
      break;
    }
    case FieldType::UInt64: {
      uint64_t v = 0;
      if (!scalar || !parse_integer(text, v)) expected(node);
      *std::get<uint64_t*>(p) = v;
      break;
    }
    case FieldType::Double: {
      double v = 0;
      if (!scalar || !parse_number(text, v)) expected(node);
      *std::get<double*>(p) = v;
      break;
    }
    case FieldType::Bool: {
      const std::string t = lower(trim(text));
      if (scalar && (t == "true" || t == "yes" || t == "on")) *std::get<bool*>(p) = true;
      else if (scalar && (t == "false" || t == "no" || t == "off")) *std::get<bool*>(p) = false;
      else expected(node);
      break;
    }
    case FieldType::String:
      if (node.IsNull()) *std::get<std::string*>(p) = "";
      else if (scalar) *std::get<std::string*>(p) = text;
      else expected(node);
      break;
    case FieldType::Enum:
      if (!scalar) expected(node);
      *std::get<std::string*>(p) = text;
      break;
    case FieldType::DoubleList: {
      std::vector<double> values;
      if (node.IsSequence()) {
        for (const YAML::Node& e : node) {
          double v = 0;
          if (!is_number_node(e) || !parse_number(e.Scalar(), v))
            fail(origin, str_cat(f.path, ": expected ", field_type_expectation(f), ", but one element is ", describe(e)),
                 line);
          values.push_back(v);
        }
      } else if (scalar) {  // Megatron's string form "98,1,1"
        std::stringstream ss(text);
        std::string item;
        while (std::getline(ss, item, ',')) {
          double v = 0;
          if (!parse_number(item, v)) expected(node, field_type_expectation(f) + " (a list, or \"98,1,1\")");
          values.push_back(v);
        }
      } else {
        expected(node);
      }
      *std::get<std::vector<double>*>(p) = std::move(values);
      break;
    }
    case FieldType::WeightedPaths: {
      WeightedPaths out;
      const std::string form = "[prefix] for one dataset or [weight1, prefix1, weight2, prefix2, ...]";
      if (node.IsNull()) {
        // empty list
      } else if (scalar) {
        out.emplace_back(1.0, text);
      } else if (node.IsSequence()) {
        std::vector<YAML::Node> items(node.begin(), node.end());
        for (const YAML::Node& e : items)
          if (!e.IsScalar()) fail(origin, str_cat(f.path, ": expected ", form, ", but one element is ", describe(e)), line);
        if (items.size() == 1) {
          if (is_number_node(items[0]))
            fail(origin, str_cat(f.path, ": [", items[0].Scalar(), "] has a weight but no path prefix; use ", form), line);
          out.emplace_back(1.0, items[0].Scalar());
        } else if (!items.empty()) {
          if (items.size() % 2 != 0)
            fail(origin, str_cat(f.path, ": ", items.size(), " elements, not weight/prefix pairs; use ", form), line);
          for (std::size_t i = 0; i < items.size(); i += 2) {
            double w = 0;
            if (!parse_number(items[i].Scalar(), w))
              fail(origin, str_cat(f.path, ": element ", i + 1, " ('", one_line(items[i].Scalar()),
                                   "') should be a weight; use ", form), line);
            if (is_number_node(items[i + 1]))
              fail(origin, str_cat(f.path, ": element ", i + 2, " (", items[i + 1].Scalar(),
                                   ") should be a path prefix; use ", form), line);
            out.emplace_back(w, items[i + 1].Scalar());
          }
        }
      } else {
        expected(node, form);
      }
      *std::get<WeightedPaths*>(p) = std::move(out);
      break;
    }
  }
  check_field_value(f, cfg, origin, line);
}

// ---------------------------------------------------------------- suggestions

// Megatron-LM's command-line spelling of an alias: tensor_model_parallel_size -> --tensor-model-parallel-size.
std::string megatron_flag(std::string name) {
  for (char& c : name)
    if (c == '_') c = '-';
  return "--" + name;
}

std::size_t threshold(const std::string& s) { return std::max<std::size_t>(2, s.size() / 3); }

// Edit distance, except that a key containing the other ("layers" in "num_layers") counts as close.
std::size_t key_distance(const std::string& typed, const std::string& key) {
  const std::size_t d = edit_distance(typed, key);
  const bool contained = typed.size() >= 4 && key.size() >= 4 &&
                         (key.find(typed) != std::string::npos || typed.find(key) != std::string::npos);
  return contained ? std::min<std::size_t>(d, 2) : d;
}

std::string normalize(const std::string& s) {
  std::string out = lower(trim(s));
  for (char& c : out)
    if (c == '-') c = '_';
  while (!out.empty() && out[0] == '_') out.erase(0, 1);  // "--num-layers" -> "num_layers"
  return out;
}

// "; did you mean 'x.y'?" or "; valid keys in model: ..." for an unknown key in a known section.
std::string suggest_key(const std::string& section, const std::string& key) {
  const std::string k = normalize(key);
  const auto& fields = config_fields();
  for (const ConfigField& f : fields)  // the same key in this or another section
    if (f.key == k) return str_cat("; did you mean '", f.path, "'?");
  for (const ConfigField& f : fields)  // a Megatron-LM argument name
    for (const std::string& a : f.aliases)
      if (a == k) return str_cat("; did you mean '", f.path, "'? (Megatron-LM's ", megatron_flag(a), ")");
  for (const bool same_section : {true, false}) {  // closest key in this section, then anywhere
    const ConfigField* best = nullptr;
    std::size_t best_d = std::numeric_limits<std::size_t>::max();
    for (const ConfigField& f : fields)
      if (!same_section || f.section == section) {
        const std::size_t d = key_distance(k, f.key);
        if (d < best_d) best_d = d, best = &f;
      }
    if (best && best_d <= threshold(k)) return str_cat("; did you mean '", best->path, "'?");
  }
  std::string list;
  for (const ConfigField& f : fields)
    if (f.section == section) list += (list.empty() ? "" : ", ") + f.key;
  return str_cat("; valid keys in ", section, ": ", list);
}

std::string suggest_section(const std::string& name) {
  const std::string n = normalize(name);
  for (const ConfigField& f : config_fields())
    if (f.key == n) return str_cat("; did you mean '", f.path, "'?");
  for (const ConfigField& f : config_fields())
    for (const std::string& a : f.aliases)
      if (a == n) return str_cat("; did you mean '", f.path, "'? (Megatron-LM's ", megatron_flag(a), ")");
  const std::string* best = nullptr;
  std::size_t best_d = std::numeric_limits<std::size_t>::max();
  for (const std::string& s : config_sections()) {
    std::size_t d = edit_distance(n, s);
    if (n.size() >= 3 && (s.rfind(n, 0) == 0 || n.rfind(s, 0) == 0)) d = 0;  // "train" -> "training"
    if (d < best_d) best_d = d, best = &s;
  }
  if (best && best_d <= threshold(n)) return str_cat("; did you mean '", *best, "'?");
  std::string list;
  for (const std::string& s : config_sections()) list += (list.empty() ? "" : ", ") + s;
  return "; valid sections: " + list;
}

// ---------------------------------------------------------------- documents and overrides

struct LoadState {
  Config cfg;
  std::set<std::string> given;  // key paths set by the file or an override
};

// An explicit tag (!!str 2, !!float x, !custom) would change how a value is read; megatrain reads
// every value by its key's type, so a tag is refused rather than ignored.
void refuse_tags(const YAML::Node& n, const std::string& origin) {
  const std::string& tag = n.Tag();
  if (!tag.empty() && tag != "?" && tag != "!") {
    std::string shown = tag;
    const std::string core = "tag:yaml.org,2002:";
    if (shown.rfind(core, 0) == 0) shown = "!!" + shown.substr(core.size());
    fail(origin, str_cat("the YAML tag '", one_line(shown), "' is not supported; remove it (each key's type "
                         "is fixed, quote a value to keep it text)"), line_of(n));
  }
  if (n.IsMap()) {
    for (const auto& kv : n) {
      refuse_tags(kv.first, origin);
      refuse_tags(kv.second, origin);
    }
  } else if (n.IsSequence()) {
    for (const auto& e : n) refuse_tags(e, origin);
  }
}

// Line (1-based) of the second document's "---", for the message; -1 when not found.
int second_document_line(const std::string& text) {
  int line = 1, markers = 0;
  bool content = false;
  for (std::size_t i = 0; i < text.size(); ++line) {
    std::size_t e = text.find('\n', i);
    if (e == std::string::npos) e = text.size();
    const std::string l = text.substr(i, e - i);
    if (l.rfind("---", 0) == 0 && (l.size() == 3 || std::isspace(static_cast<unsigned char>(l[3])))) {
      if (content || ++markers > 1) return line;
      content = l.find_first_not_of(" \t\r", 3) != std::string::npos && l[l.find_first_not_of(" \t\r", 3)] != '#';
    } else if (!trim(l).empty() && trim(l)[0] != '#' && trim(l) != "...") {
      content = true;
    }
    i = e + 1;
  }
  return -1;
}

YAML::Node parse_yaml(const std::string& text, const std::string& origin, const std::string& what) {
  try {
    std::vector<YAML::Node> docs = YAML::LoadAll(text);
    if (docs.size() > 1)
      fail(origin, "a second YAML document starts here ('---'); megatrain reads one document per file: merge them "
                   "into one or use separate files", second_document_line(text));
    if (docs.empty()) return YAML::Node();
    refuse_tags(docs[0], origin);
    return docs[0];
  } catch (const YAML::ParserException& e) {
    fail(origin, str_cat(what, " at line ", e.mark.line + 1, ", column ", e.mark.column + 1, ": ", one_line(e.msg)));
  } catch (const YAML::Exception& e) {
    fail(origin, str_cat(what, ": ", one_line(e.msg)));
  }
}

void apply_document(const YAML::Node& root, LoadState& st, const std::string& origin) {
  if (!root.IsDefined() || root.IsNull()) return;  // an empty file: defaults only
  if (!root.IsMap())
    fail(origin, str_cat("the top level must be a mapping of sections (model:, parallel:, ...), got ", describe(root)),
         line_of(root));
  std::set<std::string> seen_sections;
  for (const auto& sec : root) {
    const int sec_line = line_of(sec.first);
    if (!sec.first.IsScalar()) fail(origin, "a section name must be a plain word (model, parallel, ...)", sec_line);
    const std::string section = sec.first.Scalar();
    const auto& sections = config_sections();
    if (std::find(sections.begin(), sections.end(), section) == sections.end())
      fail(origin, str_cat("unknown section '", one_line(section), "'", suggest_section(section)), sec_line);
    if (!seen_sections.insert(section).second) fail(origin, str_cat("section '", section, "' appears twice"), sec_line);
    if (sec.second.IsNull()) continue;  // "parallel:" with nothing under it
    if (!sec.second.IsMap())
      fail(origin, str_cat("section ", section, ": expected a mapping of keys, got ", describe(sec.second)), sec_line);
    for (const auto& kv : sec.second) {
      const int key_line = line_of(kv.first);
      if (!kv.first.IsScalar()) fail(origin, str_cat("section ", section, ": a key must be a plain word"), key_line);
      const std::string path = section + "." + kv.first.Scalar();
      const ConfigField* f = find_config_field(path);
      if (!f) fail(origin, str_cat("unknown key '", one_line(path), "'", suggest_key(section, kv.first.Scalar())), key_line);
      if (st.given.count(path)) fail(origin, str_cat("key '", path, "' is given twice"), key_line);
      const int value_line = line_of(kv.second);
      assign(*f, kv.second, st.cfg, origin, value_line >= 0 ? value_line : key_line);
      st.given.insert(path);
    }
  }
}

void apply_override(const std::string& text, LoadState& st) {
  const std::string origin = "--set " + one_line(text);
  const std::size_t eq = text.find('=');
  if (eq == std::string::npos) fail(origin, "expected section.key=value (e.g. --set training.train_iters=100)");
  const std::string path = trim(text.substr(0, eq));
  const std::size_t dot = path.find('.');
  if (dot == std::string::npos)
    fail(origin, str_cat("unknown key '", one_line(path), "'", suggest_section(path)));
  const std::string section = path.substr(0, dot), key = path.substr(dot + 1);
  const auto& sections = config_sections();
  if (std::find(sections.begin(), sections.end(), section) == sections.end())
    fail(origin, str_cat("unknown section '", one_line(section), "'", suggest_section(section)));
  const ConfigField* f = find_config_field(path);
  if (!f) fail(origin, str_cat("unknown key '", one_line(path), "'", suggest_key(section, key)));
  const YAML::Node value = parse_yaml(text.substr(eq + 1), origin, "the value is not valid YAML");
  assign(*f, value, st.cfg, origin, -1);
  st.given.insert(path);
}

}  // namespace

namespace {
Config load_text(const std::string& yaml, const std::string& origin, const std::vector<std::string>& overrides,
                 bool stored) {
  LoadState st;
  st.cfg.source_file = origin;
  apply_document(parse_yaml(yaml, origin, "YAML syntax error"), st, origin);
  for (const std::string& o : overrides) apply_override(o, st);
  for (const ConfigField& f : config_fields())
    MT_CHECK(!f.required || st.given.count(f.path), config_error_prefix(origin), f.path,
             " is required (no default): add '", f.key, ":' under '", f.section, ":' or pass --set ", f.path, "=<value>");
  if (stored) reset_inactive_dependent_keys(st.cfg);
  validate_config(st.cfg);
  const Config& c = st.cfg;
  MT_CHECK(c.data.mock || !c.data.paths.empty(), config_error_prefix(origin),
           "data.paths is empty and data.mock is false: give data.paths: [PREFIX] (PREFIX.bin/.idx from "
           "megatrain-data preprocess) or set data.mock: true");
  return st.cfg;
}
}  // namespace

Config load_config_from_string(const std::string& yaml, const std::string& origin,
                               const std::vector<std::string>& overrides) {
  return load_text(yaml, origin, overrides, false);
}

Config load_stored_config(const std::string& yaml, const std::string& origin) { return load_text(yaml, origin, {}, true); }

Config load_config(const std::string& path, const std::vector<std::string>& overrides) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path p(path);
  MT_CHECK(fs::exists(p, ec), config_error_prefix(path), "file not found (looked for ", fs::absolute(p, ec).string(), ")");
  MT_CHECK(!fs::is_directory(p, ec), config_error_prefix(path), "is a directory, not a YAML file");
  std::ifstream in(p, std::ios::binary);
  MT_CHECK(in.good(), config_error_prefix(path), "cannot open: ", std::strerror(errno));
  std::ostringstream text;
  text << in.rdbuf();
  MT_CHECK(!in.bad(), config_error_prefix(path), "read error: ", std::strerror(errno));
  return load_config_from_string(text.str(), path, overrides);
}

std::string config_to_yaml(const Config& cfg) {
  std::string out = "# megatrain config: every key, defaults filled in\n";
  for (const std::string& section : config_sections()) {
    out += section + ":\n";
    for (const ConfigField& f : config_fields())
      if (f.section == section) out += "  " + f.key + ": " + format_field(f, cfg) + "\n";
  }
  return out;
}

std::string config_reference_markdown() {
  auto cell = [](const std::string& s) {
    std::string out;
    for (char c : s) out += (c == '|') ? std::string("\\|") : std::string(1, c);
    return out;
  };
  std::string out = "| key | type | default | meaning |\n|---|---|---|---|\n";
  for (const ConfigField& f : config_fields()) {
    std::string meaning = f.doc;
    if (!f.aliases.empty()) {
      meaning += " (Megatron-LM: ";
      for (std::size_t i = 0; i < f.aliases.size(); ++i)
        meaning += (i ? ", `" : "`") + megatron_flag(f.aliases[i]) + "`";
      meaning += ")";
    }
    const std::string def = f.required ? std::string("**required**") : "`" + f.default_text + "`";
    out += str_cat("| `", f.path, "` | ", cell(field_type_name(f)), " | ", cell(def), " | ", cell(meaning), " |\n");
  }
  return out;
}

}  // namespace mt
