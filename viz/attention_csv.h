// Attention weights as CSV, for people who want their own plots.
#pragma once

#include <string>
#include <vector>

#include "viz/attention_plot.h"

namespace nanogpt::viz {

constexpr const char* kAttentionCsvHeader = "layer,head,query,key,query_token,key_token,weight";

/// One row per panel, query and key <= query (keys after the query are masked by causality and
/// have weight 0, so they are left out): `layer,head,query,key,query_token,key_token,weight`.
/// Tokens are double-quoted UTF-8 with newline, tab, CR and backslash written as \n, \t, \r, \\;
/// weights carry 8 significant digits. Written atomically; throws "[viz] ..." on bad panels
/// (check_attention_panels) or an unwritable path.
void write_attention_csv(const std::vector<AttentionPanel>& panels, const std::vector<std::string>& token_labels,
                         const std::string& csv_path);

}  // namespace nanogpt::viz
