"""The two strands of a DNA record, as the pipeline names them (docs/strands.md).

`submit --strand forward|both` is the user's word; inside, a unit, a stream and a stored
progress array belong to one of these two.
"""
FORWARD = "+"  # the record as the input holds it
REVERSE = "-"  # its reverse complement, read from the record's end toward 0
STRANDS = (FORWARD, REVERSE)
NAMES = {FORWARD: "forward", REVERSE: "reverse"}  # in words, as messages and `inspect` say them
