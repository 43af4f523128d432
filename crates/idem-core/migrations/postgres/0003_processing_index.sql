-- Unsettled charges by age, for the /metrics gauge of the oldest one.
create index charges_processing on charges (created_at) where status = 'processing';
