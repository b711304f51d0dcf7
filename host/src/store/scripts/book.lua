-- book: creates a Life and its Plans, or nothing (common.lua's book_life says how).
-- KEYS and ARGV: those of book_life, the plugin sets from KEYS[4].
return book_life(4)
