"""The one exception type that means "the user gave us something we cannot use".

The CLI prints such an error as a single line and exits with status 2, so every message
must name the offending input (a path, an option and its value) and say what is wrong.
"""


class UserInputError(Exception):
    pass
