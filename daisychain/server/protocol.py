"""Moved: the signaling protocol is spoken by the server and the peers alike, so it lives in
:mod:`daisychain.signaling`. This name stays as an alias of that module (the same module
object) for code that still imports it here."""

import sys

from daisychain import signaling

sys.modules[__name__] = signaling
