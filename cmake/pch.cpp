// Anchor for the shared precompiled header (cmake/pch.h).
