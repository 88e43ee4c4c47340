"""Operations: archive-ctl parses arguments and delegates to one module per command."""
