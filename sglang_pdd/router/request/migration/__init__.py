"""Request migration: when and where a failed request goes on (`rules`), how fast requests may
migrate (`limits`), and a migrated copy's feeds into the client's stream (`resumed_feeds`)."""
