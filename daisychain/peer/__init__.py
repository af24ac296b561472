"""daisychain.peer"""
