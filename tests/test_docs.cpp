// The documentation against the program: docs/configuration.md's key table against the one key table
// in train/config.cpp, and every command in the README's and docs/' shell blocks against the
// nanogpt program's own option tables (its --help), so a renamed option or key fails here.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "test_files.h"
#include "train/config.h"

using namespace nanogpt::testing;
namespace fs = std::filesystem;

namespace {

const std::string kSource = NANOGPT_SOURCE_DIR;

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// stdout of the program with these arguments; rc set to its exit status.
std::string run_program(const std::string& args, int& rc) {
  ScratchDir tmp;
  const std::string out = tmp / "stdout";
  const int status = std::system((std::string(NANOGPT_BINARY) + " " + args + " >" + out + " 2>/dev/null </dev/null").c_str());
  rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return slurp(out);
}

// The lines of docs/configuration.md between its keys:begin and keys:end markers.
std::vector<std::string> generated_block(const std::string& page, int& begin_line) {
  std::vector<std::string> block;
  bool inside = false;
  begin_line = -1;
  const auto lines = lines_of(page);
  for (size_t i = 0; i < lines.size(); ++i) {
    if (lines[i].rfind("<!-- keys:begin", 0) == 0) {
      inside = true;
      begin_line = static_cast<int>(i) + 1;
    } else if (lines[i].rfind("<!-- keys:end", 0) == 0) {
      inside = false;
    } else if (inside) {
      block.push_back(lines[i]);
    }
  }
  return block;
}

// The key a table row documents: "| `name` | ..." -> name; "" for any other line.
std::string row_key(const std::string& line) {
  static const std::regex row(R"(^\| `([^`]+)` \|)");
  std::smatch m;
  return std::regex_search(line, m, row) ? m[1].str() : "";
}

std::string trimmed(const std::vector<std::string>& lines) {
  size_t first = 0, last = lines.size();
  while (first < last && lines[first].empty()) ++first;
  while (last > first && lines[last - 1].empty()) --last;
  std::string text;
  for (size_t i = first; i < last; ++i) text += lines[i] + "\n";
  return text;
}

}  // namespace

TEST(ConfigPage, EveryKeyHasItsLine) {
  int begin = 0;
  const auto block = generated_block(slurp(kSource + "/docs/configuration.md"), begin);
  ASSERT_GT(begin, 0) << "docs/configuration.md lacks its <!-- keys:begin --> line";
  std::set<std::string> documented;
  for (const auto& line : block)
    if (!row_key(line).empty()) documented.insert(row_key(line));
  for (const auto& key : nanogpt::train::config_keys())
    EXPECT_TRUE(documented.count(key)) << "docs/configuration.md has no line for the key '" << key
                                       << "': run scripts/gen_config_doc.sh";
}

TEST(ConfigPage, NamesNoKeyThatDoesNotExist) {
  int begin = 0;
  const auto block = generated_block(slurp(kSource + "/docs/configuration.md"), begin);
  ASSERT_GT(begin, 0) << "docs/configuration.md lacks its <!-- keys:begin --> line";
  const auto keys = nanogpt::train::config_keys();
  const std::set<std::string> known(keys.begin(), keys.end());
  size_t rows = 0;
  for (size_t i = 0; i < block.size(); ++i) {
    const std::string key = row_key(block[i]);
    if (key.empty()) continue;
    ++rows;
    EXPECT_TRUE(known.count(key)) << "docs/configuration.md:" << begin + 1 + static_cast<int>(i) << " documents '"
                                  << key << "', which is no config key: run scripts/gen_config_doc.sh";
  }
  EXPECT_EQ(rows, keys.size()) << "a key is documented twice";
}

TEST(ConfigPage, IsTheProgramsTableWordForWord) {
  int begin = 0, rc = -1;
  const auto block = generated_block(slurp(kSource + "/docs/configuration.md"), begin);
  const std::string program = run_program("train --keys=markdown", rc);
  ASSERT_EQ(rc, 0) << "nanogpt train --keys=markdown failed";
  EXPECT_EQ(trimmed(block), trimmed(lines_of(program)))
      << "docs/configuration.md's key table is not the program's (a type, default, range or line changed): "
         "run scripts/gen_config_doc.sh";
}

TEST(ConfigPage, TrainHelpListsEveryKey) {
  int rc = -1;
  const std::string help = run_program("train --help", rc);
  ASSERT_EQ(rc, 0);
  for (const auto& key : nanogpt::train::config_key_table()) {
    const std::regex line("\\n  " + key.name + " +" + key.type + " ");
    EXPECT_TRUE(std::regex_search(help, line)) << "train --help does not list '" << key.name << "' with its type";
  }
}

namespace {

struct Command {
  std::string file;
  int line = 0;
  std::vector<std::string> words;  // from "build/nanogpt" on, up to the end of this command
};

// Shell words of one line, quotes removed; stops at an unquoted '#'. Operators (&&, |, ;) are words.
std::vector<std::string> shell_words(const std::string& line) {
  std::vector<std::string> words;
  std::string word;
  bool have = false;
  char quote = 0;
  for (size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (quote) {
      if (c == quote) quote = 0;
      else word += c;
    } else if (c == '\'' || c == '"') {
      quote = c;
      have = true;
    } else if (c == '#' && !have) {
      break;
    } else if (c == ' ' || c == '\t') {
      if (have) words.push_back(word);
      word.clear();
      have = false;
    } else {
      word += c;
      have = true;
    }
  }
  if (have) words.push_back(word);
  return words;
}

// Every `build/nanogpt ...` command in the ```sh / ```bash blocks of a Markdown file.
std::vector<Command> commands_in(const std::string& path, const std::string& name, std::vector<std::string>& words_seen) {
  std::vector<Command> commands;
  const auto lines = lines_of(slurp(path));
  bool in_shell = false, in_other = false;
  for (size_t i = 0; i < lines.size(); ++i) {
    const std::string& line = lines[i];
    if (line.rfind("```", 0) == 0) {
      if (in_shell || in_other) {
        in_shell = in_other = false;
      } else {
        const std::string lang = line.substr(3);
        (lang == "sh" || lang == "bash" ? in_shell : in_other) = true;
      }
      continue;
    }
    if (!in_shell) continue;
    std::string joined = line;
    const int first = static_cast<int>(i) + 1;
    while (!joined.empty() && joined.back() == '\\' && i + 1 < lines.size()) joined.pop_back(), joined += " " + lines[++i];
    const auto words = shell_words(joined);
    words_seen.insert(words_seen.end(), words.begin(), words.end());
    for (size_t w = 0; w < words.size(); ++w) {
      if (words[w] != "build/nanogpt") continue;
      Command c{name, first, {}};
      for (size_t k = w; k < words.size() && words[k] != "&&" && words[k] != "|" && words[k] != ";" && words[k] != "||"; ++k)
        c.words.push_back(words[k]);
      commands.push_back(c);
    }
  }
  return commands;
}

// The README and the reference pages. The dated log (docs/perf-log.md, its index, and the entries in
// docs/perf-log/) records commands as they were run then: the index is skipped by name, and the
// folder because the iterator does not descend into it.
std::vector<std::pair<std::string, std::string>> documented_files() {
  std::vector<std::pair<std::string, std::string>> files{{kSource + "/README.md", "README.md"}};
  for (const auto& entry : fs::directory_iterator(kSource + "/docs"))
    if (entry.is_regular_file() && entry.path().extension() == ".md" && entry.path().filename() != "perf-log.md")
      files.emplace_back(entry.path().string(), "docs/" + entry.path().filename().string());
  return files;
}

}  // namespace

TEST(DocumentedCommands, UseOnlySubcommandsOptionsAndKeysTheProgramHas) {
  const auto keys = nanogpt::train::config_keys();
  const std::set<std::string> config_keys(keys.begin(), keys.end());
  std::map<std::string, std::set<std::string>> options;  // subcommand -> its --options, from its --help
  std::map<std::string, bool> exists;
  static const std::regex option_name(R"((?:^|[\s,\[])(--[A-Za-z0-9_][A-Za-z0-9_-]*))");
  size_t checked = 0;
  for (const auto& [path, name] : documented_files()) {
    std::vector<std::string> words;
    for (const Command& c : commands_in(path, name, words)) {
      const std::string where = c.file + ":" + std::to_string(c.line);
      if (c.words.size() < 2) {
        ADD_FAILURE() << where << ": build/nanogpt without a subcommand";
        continue;
      }
      const std::string& sub = c.words[1];
      if (sub.rfind("--", 0) == 0) continue;  // build/nanogpt --version
      if (!exists.count(sub)) {
        int rc = -1;
        const std::string help = run_program(sub + " --help", rc);
        exists[sub] = rc == 0;
        for (std::sregex_iterator it(help.begin(), help.end(), option_name), end; it != end; ++it)
          options[sub].insert((*it)[1].str());
      }
      if (!exists[sub]) {
        ADD_FAILURE() << where << ": the program has no subcommand '" << sub << "'";
        continue;
      }
      ++checked;
      for (size_t k = 2; k < c.words.size(); ++k) {
        std::string word = c.words[k];
        while (!word.empty() && (word.front() == '[' || word.front() == '(')) word.erase(0, 1);
        while (!word.empty() && (word.back() == ']' || word.back() == ')')) word.pop_back();
        if (word.rfind("--", 0) == 0) {
          const size_t eq = word.find('=');
          const std::string flag = word.substr(0, eq);
          const bool override_key = (sub == "train" || sub == "bench") && eq != std::string::npos &&
                                    config_keys.count(flag.substr(2));
          EXPECT_TRUE(options[sub].count(flag) || override_key)
              << where << ": `build/nanogpt " << sub << "` has no option " << flag
              << ((sub == "train" || sub == "bench") ? " and no config key " + flag.substr(2) : "");
        } else if (word.rfind("configs/", 0) == 0) {
          EXPECT_TRUE(fs::exists(kSource + "/" + word)) << where << ": no file " << word;
        }
      }
    }
    for (const std::string& word : words) {
      EXPECT_NE(word, "nanogpt") << name << ": a command spelt `nanogpt`; the docs write it `build/nanogpt`";
      if (word.rfind("scripts/", 0) == 0) {
        EXPECT_TRUE(fs::exists(kSource + "/" + word)) << name << ": no file " << word;
      }
    }
  }
  EXPECT_GE(checked, 10u) << "found too few documented commands: did the README lose its ```sh blocks?";
}

TEST(DocumentedCommands, ReadmeAndPerformancePageStayShort) {
  const std::vector<std::pair<std::string, size_t>> pages{
      {"README.md", 200}, {"docs/performance.md", 200}, {"docs/architecture.md", 120}, {"docs/perf-log.md", 120}};
  for (const auto& [name, most] : pages) {
    const size_t n = lines_of(slurp(kSource + "/" + name)).size();
    EXPECT_LE(n, most) << name << " has " << n << " lines: it stays a page a newcomer reads; move detail to docs/";
  }
}

namespace {

// A heading's anchor as GitHub makes it: lowercase, spaces to '-', punctuation dropped ('-' and '_'
// kept). Non-ASCII characters are dropped too: GitHub keeps letters (é) but drops symbols (×), and
// no heading of the log has a non-ASCII letter.
std::string github_anchor(const std::string& heading) {
  std::string anchor;
  for (const unsigned char c : heading) {
    if (std::isalnum(c)) anchor += static_cast<char>(std::tolower(c));
    else if (c == ' ' || c == '-') anchor += '-';
    else if (c == '_') anchor += '_';
  }
  return anchor;
}

// The `## ` headings of a Markdown file, outside code blocks, in order.
std::vector<std::string> entry_headings(const std::string& path) {
  std::vector<std::string> headings;
  bool in_code = false;
  for (const std::string& line : lines_of(slurp(path))) {
    if (line.rfind("```", 0) == 0) in_code = !in_code;
    else if (!in_code && line.rfind("## ", 0) == 0) headings.push_back(line.substr(3));
  }
  return headings;
}

}  // namespace

TEST(PerfLog, TheIndexLinksEveryEntryOfEveryAreaFile) {
  const std::string index = slurp(kSource + "/docs/perf-log.md");
  std::set<std::string> linked;  // "perf-log/AREA.md#anchor"
  static const std::regex link(R"(\]\((perf-log/[a-z0-9-]+\.md#[^)\s]+)\))");
  for (std::sregex_iterator it(index.begin(), index.end(), link), end; it != end; ++it) linked.insert((*it)[1].str());
  std::set<std::string> entries;
  size_t files = 0;
  for (const auto& entry : fs::directory_iterator(kSource + "/docs/perf-log")) {
    if (entry.path().extension() != ".md") continue;
    ++files;
    const std::string name = "perf-log/" + entry.path().filename().string();
    const auto headings = entry_headings(entry.path().string());
    EXPECT_FALSE(headings.empty()) << "docs/" << name << " holds no entry";
    for (const std::string& heading : headings) {
      const std::string target = name + "#" + github_anchor(heading);
      entries.insert(target);
      EXPECT_TRUE(linked.count(target)) << "docs/perf-log.md has no line for the entry '" << heading << "' (" << target << ")";
    }
  }
  EXPECT_GE(files, 2u) << "docs/perf-log/ lost its area files";
  for (const std::string& target : linked)
    EXPECT_TRUE(entries.count(target)) << "docs/perf-log.md links " << target << ", which is no entry's heading";
}
