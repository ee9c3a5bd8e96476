-- Holds slot ?2 of key ?1 until ?4 if holder ?3 still has it. No row: it was taken over.
UPDATE redrive_flow_slots SET until = ?4
WHERE key = ?1 AND slot = ?2 AND token = ?3
RETURNING 1
