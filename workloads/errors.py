"""Errors that mean "the user's input is wrong": the CLI turns them into a message and exit code 2."""


class UserInputError(ValueError):
    """Bad input (file, parameter, id). The message names the problem and the fix."""
