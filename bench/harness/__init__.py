"""What every benchmark shares, written once: ``timing`` (clocks, rotation, side-by-side rounds,
statistics), ``memory`` (peak extra memory of a call), ``baselines`` (the transformers verification
and sampling steps, and the specdec_ext calls they are set against), ``env`` (device, machine,
versions, load) and ``report`` (the result header, file names, JSON, tables)."""
