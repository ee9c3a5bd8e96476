-- The unique indexes of table ?1, each with its columns in order (comma-separated) and whether it
-- covers every row (not partial).
SELECT l.name AS index_name, l.partial = 0 AS whole,
       (SELECT group_concat(name, ',') FROM (SELECT i.name FROM pragma_index_info(l.name) i ORDER BY i.seqno))
           AS columns
FROM pragma_index_list(?1) l
WHERE l."unique" = 1
