// NEON instructions that Go's arm64 assembler does not know, as WORD
// encodings taking register numbers in the order of the Arm syntax
// (destination first): FMUL4(d, n, m) is FMUL Vd.4S, Vn.4S, Vm.4S, that is
// Vd = Vn·Vm. Each encoding was checked against llvm-mc.

#define SDOT(d, n, m) WORD $(0x4e809400|((m)<<16)|((n)<<5)|(d)) /* SDOT Vd.4S, Vn.16B, Vm.16B */
#define SMULL8(d, n, m) WORD $(0x0e20c000|((m)<<16)|((n)<<5)|(d)) /* SMULL Vd.8H, Vn.8B, Vm.8B */
#define SMLAL8(d, n, m) WORD $(0x0e208000|((m)<<16)|((n)<<5)|(d)) /* SMLAL Vd.8H, Vn.8B, Vm.8B */
#define SMLAL16(d, n, m) WORD $(0x4e208000|((m)<<16)|((n)<<5)|(d)) /* SMLAL2 Vd.8H, Vn.16B, Vm.16B */
#define SADDLP4(d, n) WORD $(0x4e602800|((n)<<5)|(d)) /* SADDLP Vd.4S, Vn.8H */
#define SCVTF4(d, n) WORD $(0x4e21d800|((n)<<5)|(d)) /* SCVTF Vd.4S, Vn.4S */
#define FCVTZS4(d, n) WORD $(0x4ea1b800|((n)<<5)|(d)) /* FCVTZS Vd.4S, Vn.4S */
#define FRINTM4(d, n) WORD $(0x4e219800|((n)<<5)|(d)) /* FRINTM Vd.4S, Vn.4S */
#define FNEG4(d, n) WORD $(0x6ea0f800|((n)<<5)|(d)) /* FNEG Vd.4S, Vn.4S */
#define FMUL4(d, n, m) WORD $(0x6e20dc00|((m)<<16)|((n)<<5)|(d)) /* FMUL Vd.4S, Vn.4S, Vm.4S */
#define FADD4(d, n, m) WORD $(0x4e20d400|((m)<<16)|((n)<<5)|(d)) /* FADD Vd.4S, Vn.4S, Vm.4S */
#define FSUB4(d, n, m) WORD $(0x4ea0d400|((m)<<16)|((n)<<5)|(d)) /* FSUB Vd.4S, Vn.4S, Vm.4S */
#define FDIV4(d, n, m) WORD $(0x6e20fc00|((m)<<16)|((n)<<5)|(d)) /* FDIV Vd.4S, Vn.4S, Vm.4S */
#define FMAX4(d, n, m) WORD $(0x4e20f400|((m)<<16)|((n)<<5)|(d)) /* FMAX Vd.4S, Vn.4S, Vm.4S */
#define FMIN4(d, n, m) WORD $(0x4ea0f400|((m)<<16)|((n)<<5)|(d)) /* FMIN Vd.4S, Vn.4S, Vm.4S */
#define FCMGT4(d, n, m) WORD $(0x6ea0e400|((m)<<16)|((n)<<5)|(d)) /* FCMGT Vd.4S, Vn.4S, Vm.4S: Vn > Vm */
#define BIC16(d, n, m) WORD $(0x4e601c00|((m)<<16)|((n)<<5)|(d)) /* BIC Vd.16B, Vn.16B, Vm.16B: Vn &^ Vm */
#define FADDP4(d, n, m) WORD $(0x6e20d400|((m)<<16)|((n)<<5)|(d)) /* FADDP Vd.4S, Vn.4S, Vm.4S */
#define FADDP2S(d, n) WORD $(0x7e30d800|((n)<<5)|(d)) /* FADDP Sd, Vn.2S */
#define FMAXV4(d, n) WORD $(0x6e30f800|((n)<<5)|(d)) /* FMAXV Sd, Vn.4S */
#define SHL4(d, n, sh) WORD $(0x4f005400|((32+(sh))<<16)|((n)<<5)|(d)) /* SHL Vd.4S, Vn.4S, #sh */
#define ADDI4(d, n, m) WORD $(0x4ea08400|((m)<<16)|((n)<<5)|(d)) /* ADD Vd.4S, Vn.4S, Vm.4S */
#define FABS4(d, n) WORD $(0x4ea0f800|((n)<<5)|(d)) /* FABS Vd.4S, Vn.4S */
#define FCVTL4(d, n) WORD $(0x0e217800|((n)<<5)|(d)) /* FCVTL Vd.4S, Vn.4H */
#define FCVTL24(d, n) WORD $(0x4e217800|((n)<<5)|(d)) /* FCVTL2 Vd.4S, Vn.8H */
