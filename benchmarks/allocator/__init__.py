"""The allocator bench: expandable segments vs the plain caching allocator under dynamic shapes."""
