// Writing plot outputs so that a reader (an image viewer refreshing loss.png during training)
// never sees half a file: the bytes go to a temporary sibling that is then renamed over the target.
#pragma once

#include <string>
#include <string_view>

namespace nanogpt::viz {

/// Atomically replaces `path` with `bytes`. Throws "[viz] cannot write 'path': reason (hint)";
/// on failure `path` is untouched and no temporary file is left behind.
void write_file_atomically(const std::string& path, std::string_view bytes);

}  // namespace nanogpt::viz
