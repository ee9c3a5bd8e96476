-- A closed record's archived message, deleted: the record keeps what is kept of it.
DELETE FROM pgmq.{archive} WHERE msg_id = $1
