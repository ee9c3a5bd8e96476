-- Frees slot ?2 of key ?1 if holder ?3 still has it; a slot taken over stays with its new holder.
DELETE FROM redrive_flow_slots WHERE key = ?1 AND slot = ?2 AND token = ?3
