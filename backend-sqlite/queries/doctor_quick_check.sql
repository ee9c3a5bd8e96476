-- The file's structure, page by page (`ok`, or what is wrong).
PRAGMA quick_check
